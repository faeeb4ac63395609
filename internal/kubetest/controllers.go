package kubetest

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// ControllerManagerUser is the user kube-controller-manager authenticates
// as, the name kubeadm gives it; the API server's bootstrap RBAC binds it
// to the system:kube-controller-manager role, which lets it mint its
// controllers' service-account tokens and nothing more.
const ControllerManagerUser = "system:kube-controller-manager"

// ControllerUser is the identity a controller of the controller-manager
// acts as: each uses its own service account
// (--use-service-account-credentials), as on kubeadm and kind clusters.
func ControllerUser(controller string) string {
	return "system:serviceaccount:kube-system:" + controller
}

// ControllerManager is a kube-controller-manager running against an Env.
type ControllerManager struct {
	// Started is when the process started.
	Started time.Time

	cmd    *exec.Cmd
	log    *tailBuffer
	exited chan struct{}
	err    error // the process's exit, once exited is closed
}

// StartControllerManager starts kube-controller-manager from
// KUBEBUILDER_ASSETS (hack/kube-bins.sh builds it beside kube-apiserver)
// with only the given controllers, e.g. deployment-controller and
// replicaset-controller. It runs without leader election and without its
// HTTPS port, and stops with the test; its log is printed if the test
// failed. Nothing runs pods, so ReplicaSets create Pods that stay Pending.
func (e *Env) StartControllerManager(t testing.TB, controllers ...string) *ControllerManager {
	t.Helper()
	bin := filepath.Join(os.Getenv("KUBEBUILDER_ASSETS"), "kube-controller-manager")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("kube-controller-manager: %v; build it beside kube-apiserver: export KUBEBUILDER_ASSETS=\"$(hack/kube-bins.sh)\"", err)
	}
	user, err := e.Envtest.AddUser(envtest.User{Name: ControllerManagerUser}, e.Config)
	if err != nil {
		t.Fatalf("add user %s: %v", ControllerManagerUser, err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "kube-controller-manager.kubeconfig")
	if err := writeKubeconfig(kubeconfig, user.Config(), Kubeconfig{}); err != nil {
		t.Fatal(err)
	}
	cm := &ControllerManager{log: &tailBuffer{max: 1 << 20}, exited: make(chan struct{})}
	cm.cmd = exec.Command(bin,
		"--kubeconfig="+kubeconfig,
		"--controllers="+strings.Join(controllers, ","),
		"--use-service-account-credentials=true",
		"--leader-elect=false",
		"--secure-port=0",
		// The defaults (20 QPS, burst 30) throttle a test that rolls out
		// several Deployments at once.
		"--kube-api-qps=100", "--kube-api-burst=200",
		"--v=2",
	)
	cm.cmd.Stdout, cm.cmd.Stderr = cm.log, cm.log
	if err := cm.cmd.Start(); err != nil {
		t.Fatalf("start kube-controller-manager: %v", err)
	}
	cm.Started = time.Now()
	go func() {
		cm.err = cm.cmd.Wait()
		close(cm.exited)
	}()
	t.Cleanup(func() {
		cm.stop()
		if t.Failed() {
			t.Logf("kube-controller-manager log (last %d bytes):\n%s", cm.log.Len(), cm.log.String())
		}
	})
	return cm
}

// Err is nil while the process runs, and says how it ended once it has.
// Tests poll it with what they wait for, so that a controller-manager that
// could not start fails them at once.
func (cm *ControllerManager) Err() error {
	select {
	case <-cm.exited:
		err := cm.err
		if err == nil {
			err = errors.New("exit status 0")
		}
		return fmt.Errorf("kube-controller-manager exited: %w; log tail:\n%s", err, lastLines(cm.log.String(), 20))
	default:
		return nil
	}
}

// stop ends the process: SIGTERM, then SIGKILL after 10 s.
func (cm *ControllerManager) stop() {
	select {
	case <-cm.exited:
		return
	default:
	}
	if err := cm.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		_ = cm.cmd.Process.Kill()
	}
	select {
	case <-cm.exited:
	case <-time.After(10 * time.Second):
		_ = cm.cmd.Process.Kill()
		<-cm.exited
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// tailBuffer keeps the last max bytes written to it (a process's log).
type tailBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
	max int
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf.Write(p)
	if over := b.buf.Len() - b.max; over > 0 {
		b.buf.Next(over)
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Len is the number of bytes kept.
func (b *tailBuffer) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Len()
}
