package kubetest

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/policyd/policyd/internal/poll"
)

func TestStartWithoutAssets(t *testing.T) {
	t.Setenv("KUBEBUILDER_ASSETS", "")
	env, err := Start(Options{})
	if !errors.Is(err, ErrNoAssets) || env != nil {
		t.Fatalf("Start() = %v, %v; want nil, ErrNoAssets", env, err)
	}
}

func TestWarnings(t *testing.T) {
	var w Warnings
	w.HandleWarningHeader(299, "", "one")
	w.HandleWarningHeader(299, "", "two")
	if got := w.Take(); len(got) != 2 || got[0] != "one" || got[1] != "two" {
		t.Fatalf("Take() = %q, want [one two]", got)
	}
	if got := w.Take(); len(got) != 0 {
		t.Fatalf("second Take() = %q, want none", got)
	}
}

// TestControllerManager starts the real deployment and replicaset
// controllers: a Deployment gets its ReplicaSet, a Pod and its status, and
// the process stops with the test that started it.
func TestControllerManager(t *testing.T) {
	if testing.Short() {
		t.Skip("starts kube-apiserver, etcd and kube-controller-manager: not in -short (make check)")
	}
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Fatal(ErrNoAssets)
	}
	env, err := Start(Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Error(err)
		}
	})
	var cm *ControllerManager
	t.Run("reconciles", func(t *testing.T) {
		cm = env.StartControllerManager(t, "deployment-controller", "replicaset-controller")
		ns := env.Namespace(t, nil, nil)
		labels := map[string]string{"app": "x"}
		dep := &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: "x", Namespace: ns},
			Spec: appsv1.DeploymentSpec{
				Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: labels},
					Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "x", Image: "example.com/x:1"}}},
				},
			},
		}
		if _, err := env.Kube.AppsV1().Deployments(ns).Create(t.Context(), dep, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		poll.Eventually(t, "a ReplicaSet, a Pod and the Deployment's status", func() error {
			if err := cm.Err(); err != nil {
				t.Fatal(err)
			}
			d, err := env.Kube.AppsV1().Deployments(ns).Get(t.Context(), "x", metav1.GetOptions{})
			if err != nil {
				return err
			}
			rss, err := env.Kube.AppsV1().ReplicaSets(ns).List(t.Context(), metav1.ListOptions{})
			if err != nil {
				return err
			}
			pods, err := env.Kube.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{})
			if err != nil {
				return err
			}
			if len(rss.Items) != 1 || len(pods.Items) != 1 || d.Status.ObservedGeneration != d.Generation {
				return fmt.Errorf("%d ReplicaSets, %d Pods, observed generation %d of %d", len(rss.Items), len(pods.Items), d.Status.ObservedGeneration, d.Generation)
			}
			return nil
		}, poll.Within(60*time.Second))

	})
	if cm == nil {
		return
	}
	if err := cm.Err(); err == nil || !strings.Contains(err.Error(), "exited") {
		t.Errorf("after its test, Err() = %v, want the process to have exited", err)
	}
}
