package kubernetes_test

import (
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/policyd/policyd/internal/config"
	"github.com/policyd/policyd/internal/drift/admission"
)

// convert converts a manifest to its API type; an unknown field fails.
func convert[T any](t *testing.T, m manifest, into *T) {
	t.Helper()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(m.obj.Object, into, true); err != nil {
		t.Fatalf("%v: %v", m, err)
	}
}

// typed finds the one document of a kind (and name, if not empty) and
// converts it to its API type.
func typed[T any](t *testing.T, ms []manifest, kind, name string, into *T) {
	t.Helper()
	var found []manifest
	for _, m := range ms {
		if m.obj.GetKind() == kind && (name == "" || m.obj.GetName() == name) {
			found = append(found, m)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d documents of kind %s named %q, want 1", len(found), kind, name)
	}
	convert(t, found[0], into)
}

// configMaps is the data of every ConfigMap among ms, by namespace/name.
func configMaps(t *testing.T, ms []manifest) map[string]map[string]string {
	t.Helper()
	out := map[string]map[string]string{}
	for _, m := range ms {
		if m.obj.GetKind() == "ConfigMap" {
			var cm corev1.ConfigMap
			convert(t, m, &cm)
			out[cm.Namespace+"/"+cm.Name] = cm.Data
		}
	}
	return out
}

// podEnv is the environment container c sees in pod podName, as the kubelet
// builds it: envFrom first (from the ConfigMaps among the manifests), then
// env, with $(VAR) references expanded and downward API values filled in.
func podEnv(t *testing.T, c corev1.Container, podName, namespace string, cms map[string]map[string]string) []string {
	t.Helper()
	vals := map[string]string{}
	var order []string
	set := func(k, v string) {
		if _, ok := vals[k]; !ok {
			order = append(order, k)
		}
		vals[k] = v
	}
	for _, from := range c.EnvFrom {
		ref := from.ConfigMapRef
		if ref == nil || from.Prefix != "" {
			t.Fatalf("envFrom %+v: only configMapRef without prefix is simulated by this test", from)
		}
		data, ok := cms[namespace+"/"+ref.Name]
		if !ok {
			if ref.Optional == nil || !*ref.Optional {
				t.Fatalf("envFrom: ConfigMap %s is not among the manifests and not optional: the pod would not start", ref.Name)
			}
			continue
		}
		for _, k := range slices.Sorted(maps.Keys(data)) {
			set(k, data[k])
		}
	}
	for _, e := range c.Env {
		v := e.Value
		switch {
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil:
			switch e.ValueFrom.FieldRef.FieldPath {
			case "metadata.name":
				v = podName
			case "metadata.namespace":
				v = namespace
			default:
				t.Fatalf("env %s: field %s is not simulated by this test", e.Name, e.ValueFrom.FieldRef.FieldPath)
			}
		case e.ValueFrom != nil && e.ValueFrom.ResourceFieldRef != nil:
			v = resourceField(t, c, e.Name, e.ValueFrom.ResourceFieldRef)
		case e.ValueFrom != nil:
			t.Fatalf("env %s: only fieldRef and resourceFieldRef sources are simulated by this test", e.Name)
		default:
			for k, kv := range vals {
				v = strings.ReplaceAll(v, "$("+k+")", kv)
			}
			if strings.Contains(v, "$(") {
				t.Fatalf("env %s=%q refers to a variable not defined before it", e.Name, e.Value)
			}
		}
		set(e.Name, v)
	}
	env := make([]string, 0, len(order))
	for _, k := range order {
		env = append(env, k+"="+vals[k])
	}
	return env
}

// resourceField is the value of a resourceFieldRef: the container's limit
// or request divided by the divisor, rounded up. An unset limit would give
// the node's allocatable instead, which the test refuses.
func resourceField(t *testing.T, c corev1.Container, name string, ref *corev1.ResourceFieldSelector) string {
	t.Helper()
	if ref.ContainerName != "" && ref.ContainerName != c.Name {
		t.Fatalf("env %s: resourceFieldRef names container %q, not its own %q", name, ref.ContainerName, c.Name)
	}
	list, res := c.Resources.Limits, ""
	switch {
	case strings.HasPrefix(ref.Resource, "limits."):
		res = strings.TrimPrefix(ref.Resource, "limits.")
	case strings.HasPrefix(ref.Resource, "requests."):
		list, res = c.Resources.Requests, strings.TrimPrefix(ref.Resource, "requests.")
	default:
		t.Fatalf("env %s: resource %q is not simulated by this test", name, ref.Resource)
	}
	q, ok := list[corev1.ResourceName(res)]
	if !ok || q.IsZero() {
		t.Fatalf("env %s: %s is not set on the container", name, ref.Resource)
	}
	div := ref.Divisor
	if div.IsZero() {
		div = resource.MustParse("1")
	}
	return strconv.FormatInt((q.Value()+div.Value()-1)/div.Value(), 10)
}

func port(t *testing.T, c corev1.Container, name string) int {
	t.Helper()
	for _, p := range c.Ports {
		if p.Name == name {
			return int(p.ContainerPort)
		}
	}
	t.Fatalf("container %s has no port %q", c.Name, name)
	return 0
}

func mountPath(t *testing.T, c corev1.Container, volume string) string {
	t.Helper()
	for _, m := range c.VolumeMounts {
		if m.Name == volume {
			return m.MountPath
		}
	}
	t.Fatalf("container %s does not mount volume %q", c.Name, volume)
	return ""
}

// secretOf is the Secret mounted where file is: the config's files must
// come from Secrets the pod mounts whole (no subPath), so that an updated
// Secret reaches them.
func secretOf(t *testing.T, spec corev1.PodSpec, c corev1.Container, key, file string) string {
	t.Helper()
	if file == "" {
		t.Fatalf("%s is not set", key)
	}
	for _, m := range c.VolumeMounts {
		if m.MountPath != filepath.Dir(file) {
			continue
		}
		if m.SubPath != "" {
			t.Errorf("%s %q: volume %s is mounted with subPath, so Secret updates never reach it", key, file, m.Name)
		}
		for _, v := range spec.Volumes {
			if v.Name == m.Name && v.Secret != nil {
				return v.Secret.SecretName
			}
		}
	}
	t.Fatalf("%s %q is not in a mounted Secret", key, file)
	return ""
}

func addrPort(t *testing.T, key, addr string) (string, int) {
	t.Helper()
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("%s %q: %v", key, addr, err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatalf("%s %q: %v", key, addr, err)
	}
	return host, n
}

// targets is the set of container port names a Service's ports lead to.
func targets(svc corev1.Service) []string {
	var out []string
	for _, p := range svc.Spec.Ports {
		out = append(out, p.TargetPort.String())
	}
	slices.Sort(out)
	return out
}

// deployment is the whole rendering (base and every component), decoded.
type deployment struct {
	all                   []manifest
	sts                   appsv1.StatefulSet
	c                     corev1.Container
	cm                    corev1.ConfigMap
	headless, client      corev1.Service
	admin, webhookService corev1.Service
	pdb                   policyv1.PodDisruptionBudget
	hook                  admissionregistrationv1.MutatingWebhookConfiguration
}

func loadDeployment(t *testing.T) *deployment {
	t.Helper()
	d := &deployment{all: render(t, componentDirs(t)...)}
	typed(t, d.all, "StatefulSet", "", &d.sts)
	if n := len(d.sts.Spec.Template.Spec.Containers); n != 1 {
		t.Fatalf("%d containers, want 1", n)
	}
	d.c = d.sts.Spec.Template.Spec.Containers[0]
	typed(t, d.all, "ConfigMap", "policyd-config", &d.cm)
	typed(t, d.all, "Service", d.sts.Spec.ServiceName, &d.headless)
	typed(t, d.all, "Service", "policyd", &d.client)
	typed(t, d.all, "Service", "policyd-admin", &d.admin)
	typed(t, d.all, "PodDisruptionBudget", "", &d.pdb)
	typed(t, d.all, "MutatingWebhookConfiguration", "", &d.hook)
	if len(d.hook.Webhooks) != 1 || d.hook.Webhooks[0].ClientConfig.Service == nil {
		t.Fatalf("want one webhook served by a service: %+v", d.hook.Webhooks)
	}
	typed(t, d.all, "Service", d.hook.Webhooks[0].ClientConfig.Service.Name, &d.webhookService)
	return d
}

// loadConfig loads the ConfigMap's config file as pod sees it, given the
// ConfigMaps among ms (the drift component's, or none).
func (d *deployment) loadConfig(t *testing.T, pod string, ms []manifest) config.Config {
	t.Helper()
	cfgPath := ""
	for i, a := range d.c.Args {
		if a == "--config" && i+1 < len(d.c.Args) {
			cfgPath = d.c.Args[i+1]
		}
	}
	var cmKey string
	for _, m := range d.c.VolumeMounts {
		if m.MountPath == cfgPath {
			cmKey = m.SubPath
		}
	}
	file, ok := d.cm.Data[cmKey]
	if cfgPath == "" || !ok {
		t.Fatalf("--config %q is not a key of ConfigMap %s mounted at that path", cfgPath, d.cm.Name)
	}
	path := filepath.Join(t.TempDir(), "policyd.yaml")
	if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path, podEnv(t, d.c, pod, d.sts.Namespace, configMaps(t, ms)), nil)
	if err != nil {
		t.Fatalf("the config does not load in pod %s: %v", pod, err)
	}
	return cfg
}

func (d *deployment) pods() []string {
	var out []string
	for i := range int(*d.sts.Spec.Replicas) {
		out = append(out, fmt.Sprintf("%s-%d", d.sts.Name, i))
	}
	return out
}

// TestManifestsAgree checks that the pieces fit: the ConfigMap's config file
// loads and validates for every pod, with the environment the StatefulSet
// gives it, with drift off (the base) and on (the drift component), and its
// addresses, paths and peers match the pods, services and webhook.
func TestManifestsAgree(t *testing.T) {
	d := loadDeployment(t)
	sts, c, spec := d.sts, d.c, d.sts.Spec.Template.Spec

	if got := *sts.Spec.Replicas; got != 3 {
		t.Errorf("replicas = %d, want 3", got)
	}
	if sts.Spec.PodManagementPolicy != appsv1.ParallelPodManagement {
		t.Errorf("podManagementPolicy = %q: pods must start together to elect a first leader", sts.Spec.PodManagementPolicy)
	}
	if d.headless.Spec.ClusterIP != corev1.ClusterIPNone || !d.headless.Spec.PublishNotReadyAddresses {
		t.Errorf("service %s must be headless and publish not-ready pods (peers resolve before any is ready)", d.headless.Name)
	}
	if d.pdb.Spec.MaxUnavailable == nil || d.pdb.Spec.MaxUnavailable.IntValue() != 1 {
		t.Errorf("PodDisruptionBudget maxUnavailable = %v, want 1", d.pdb.Spec.MaxUnavailable)
	}
	if sc := spec.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		t.Error("pods must run as non-root")
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() {
		t.Error("cpu and memory requests must be set")
	}

	// Every replica, drift off (the base alone) and on.
	base := readManifests(t, ".")
	for _, pod := range d.pods() {
		t.Run(pod, func(t *testing.T) {
			off := d.loadConfig(t, pod, base)
			if off.Drift.Addr != "" {
				t.Errorf("drift.addr = %q without the drift component, want off", off.Drift.Addr)
			}
			cfg := d.loadConfig(t, pod, d.all)
			d.checkConfig(t, pod, cfg)
		})
	}

	t.Run("probes", func(t *testing.T) { d.checkProbes(t) })
	t.Run("GOMEMLIMIT", func(t *testing.T) { d.checkMemLimit(t) })
	t.Run("zone spread", func(t *testing.T) { d.checkSpread(t) })
	t.Run("services", func(t *testing.T) { d.checkServices(t) })
	t.Run("network policy", func(t *testing.T) { d.checkNetworkPolicy(t) })
	t.Run("webhook", func(t *testing.T) { d.checkWebhook(t) })
	t.Run("certificates", func(t *testing.T) { d.checkCertificates(t) })
	t.Run("secrets documented", func(t *testing.T) { d.checkSecretsDocumented(t) })
}

// checkConfig checks one pod's configuration against the manifests.
func (d *deployment) checkConfig(t *testing.T, pod string, cfg config.Config) {
	sts, c, spec := d.sts, d.c, d.sts.Spec.Template.Spec
	if cfg.NodeID != pod {
		t.Errorf("node_id = %q, want the pod name %q", cfg.NodeID, pod)
	}
	if want := mountPath(t, c, sts.Spec.VolumeClaimTemplates[0].Name); cfg.DataDir != want {
		t.Errorf("data_dir = %q, want the volume claim's mount %q", cfg.DataDir, want)
	}
	if len(cfg.Raft.Peers) != int(*sts.Spec.Replicas) {
		t.Fatalf("%d raft.peers for %d replicas", len(cfg.Raft.Peers), *sts.Spec.Replicas)
	}
	dns := pod + "." + d.headless.Name
	for _, adv := range []struct{ key, addr, port string }{
		{"raft.advertise", cfg.RaftAdvertise(), "raft"},
		{"grpc.advertise", cfg.GRPCAdvertise(), "grpc"},
		{"http.advertise", cfg.HTTPAdvertise(), "http"},
	} {
		if want := net.JoinHostPort(dns, strconv.Itoa(port(t, c, adv.port))); adv.addr != want {
			t.Errorf("%s = %q, want %q", adv.key, adv.addr, want)
		}
	}
	for j, p := range cfg.Raft.Peers {
		want := config.Peer{ID: fmt.Sprintf("%s-%d", sts.Name, j), Address: net.JoinHostPort(fmt.Sprintf("%s-%d.%s", sts.Name, j, d.headless.Name), strconv.Itoa(port(t, c, "raft")))}
		if p != want {
			t.Errorf("raft.peers[%d] = %+v, want %+v", j, p, want)
		}
	}
	for _, l := range []struct{ key, addr, port string }{
		{"http.addr", cfg.HTTP.Addr, "http"}, {"grpc.addr", cfg.GRPC.Addr, "grpc"},
		{"raft.addr", cfg.Raft.Addr, "raft"}, {"drift.addr", cfg.Drift.Addr, "drift"},
	} {
		if _, p := addrPort(t, l.key, l.addr); p != port(t, c, l.port) {
			t.Errorf("%s %q does not listen on the container's %s port %d", l.key, l.addr, l.port, port(t, c, l.port))
		}
	}

	// Secure by default: every door authenticates, from mounted Secrets.
	if cfg.Auth.Mode != "jwt" || cfg.Auth.AllowInsecureSidecars || cfg.Auth.AllowOpenAdmin || cfg.Cluster.AllowInsecurePeers {
		t.Errorf("auth.mode %q, allow_insecure_sidecars %v, allow_open_admin %v, cluster.allow_insecure_peers %v: want jwt and no opt-out",
			cfg.Auth.Mode, cfg.Auth.AllowInsecureSidecars, cfg.Auth.AllowOpenAdmin, cfg.Cluster.AllowInsecurePeers)
	}
	secretOf(t, spec, c, "auth.jwt.public_keys_file", cfg.Auth.JWT.PublicKeysFile)
	secretOf(t, spec, c, "auth.admin_tokens_file", cfg.Auth.AdminTokensFile)
	secretOf(t, spec, c, "cluster.secret_file", cfg.Cluster.SecretFile)
	serving := secretOf(t, spec, c, "http.tls.cert_file", cfg.HTTP.TLS.CertFile)
	for _, f := range []struct{ key, file string }{
		{"http.tls.key_file", cfg.HTTP.TLS.KeyFile},
		{"grpc.tls.cert_file", cfg.GRPC.TLS.CertFile}, {"grpc.tls.key_file", cfg.GRPC.TLS.KeyFile},
		{"drift.tls.cert_file", cfg.Drift.TLS.CertFile}, {"drift.tls.key_file", cfg.Drift.TLS.KeyFile},
	} {
		if s := secretOf(t, spec, c, f.key, f.file); s != serving {
			t.Errorf("%s is in Secret %s, want the serving certificate's %s", f.key, s, serving)
		}
	}
	// The kubelet's probes present no client certificate.
	if cfg.HTTP.TLS.ClientCAFile != "" {
		t.Errorf("http.tls.client_ca_file is set: the probes would be refused")
	}
	node := secretOf(t, spec, c, "raft.tls.cert_file", cfg.Raft.TLS.CertFile)
	for _, f := range []struct{ key, file string }{
		{"raft.tls.key_file", cfg.Raft.TLS.KeyFile}, {"raft.tls.client_ca_file", cfg.Raft.TLS.ClientCAFile},
	} {
		if s := secretOf(t, spec, c, f.key, f.file); s != node {
			t.Errorf("%s is in Secret %s, want the node certificate's %s", f.key, s, node)
		}
	}
	if node == serving {
		t.Errorf("raft.tls and http.tls share Secret %s: a node certificate is for the peer plane only", node)
	}
}

func (d *deployment) checkProbes(t *testing.T) {
	for _, p := range []struct {
		what  string
		probe *corev1.Probe
		path  string
	}{
		{"readiness", d.c.ReadinessProbe, "/readyz"},
		{"liveness", d.c.LivenessProbe, "/livez"},
		{"startup", d.c.StartupProbe, "/livez"},
	} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("%s probe: want GET %s", p.what, p.path)
			continue
		}
		g := p.probe.HTTPGet
		if g.Path != p.path || g.Port != intstr.FromString("http") || g.Scheme != corev1.URISchemeHTTPS {
			t.Errorf("%s probe: %s %s on port %s, want HTTPS %s on port http (http.tls is on)", p.what, g.Scheme, g.Path, g.Port.String(), p.path)
		}
	}
}

func (d *deployment) checkMemLimit(t *testing.T) {
	limit := d.c.Resources.Limits.Memory()
	if limit.IsZero() {
		t.Fatal("no memory limit")
	}
	for _, kv := range podEnv(t, d.c, d.pods()[0], d.sts.Namespace, nil) {
		if v, ok := strings.CutPrefix(kv, "GOMEMLIMIT="); ok {
			if want := strconv.FormatInt(limit.Value(), 10); v != want {
				t.Errorf("GOMEMLIMIT = %q, want the memory limit in bytes, %s", v, want)
			}
			return
		}
	}
	t.Error("GOMEMLIMIT is not set")
}

func (d *deployment) checkSpread(t *testing.T) {
	podLabels := labels.Set(d.sts.Spec.Template.Labels)
	for _, tsc := range d.sts.Spec.Template.Spec.TopologySpreadConstraints {
		sel, err := metav1.LabelSelectorAsSelector(tsc.LabelSelector)
		if err != nil {
			t.Fatal(err)
		}
		if tsc.TopologyKey == corev1.LabelTopologyZone && tsc.MaxSkew == 1 && sel.Matches(podLabels) {
			return
		}
	}
	t.Errorf("no topologySpreadConstraint with maxSkew 1 over %s selecting the pods", corev1.LabelTopologyZone)
}

// checkServices: one Service per audience, each leading only to its ports.
func (d *deployment) checkServices(t *testing.T) {
	podLabels := labels.Set(d.sts.Spec.Template.Labels)
	for _, s := range []struct {
		svc  corev1.Service
		want []string
	}{
		{d.headless, []string{"raft"}},
		{d.client, []string{"grpc", "http"}},
		{d.admin, []string{"http"}},
		{d.webhookService, []string{"drift"}},
	} {
		if got := targets(s.svc); !slices.Equal(got, s.want) {
			t.Errorf("service %s leads to container ports %v, want %v", s.svc.Name, got, s.want)
		}
		if !labels.SelectorFromSet(s.svc.Spec.Selector).Matches(podLabels) || len(s.svc.Spec.Selector) == 0 {
			t.Errorf("service %s selects %v, not the StatefulSet's pods", s.svc.Name, s.svc.Spec.Selector)
		}
	}
	for _, m := range d.all {
		if m.obj.GetKind() != "Service" || m.obj.GetName() == d.headless.Name {
			continue
		}
		var svc corev1.Service
		convert(t, m, &svc)
		if slices.Contains(targets(svc), "raft") {
			t.Errorf("service %s exposes the raft port: only the headless service names it", svc.Name)
		}
	}
}

// checkNetworkPolicy: the raft port admits the StatefulSet's own pods only,
// under every NetworkPolicy that selects them (policies add up), and the
// sidecar and admin ports are open.
func (d *deployment) checkNetworkPolicy(t *testing.T) {
	podLabels := labels.Set(d.sts.Spec.Template.Labels)
	raftPort := intstr.FromInt32(int32(port(t, d.c, "raft")))
	opens := func(ports []networkingv1.NetworkPolicyPort, name string, num int) bool {
		if len(ports) == 0 {
			return true // no ports: every port
		}
		for _, p := range ports {
			if p.Port == nil || *p.Port == intstr.FromString(name) || *p.Port == intstr.FromInt32(int32(num)) {
				return true
			}
		}
		return false
	}
	var selecting int
	open := map[string]bool{}
	for _, m := range d.all {
		if m.obj.GetKind() != "NetworkPolicy" {
			continue
		}
		var np networkingv1.NetworkPolicy
		convert(t, m, &np)
		sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		if err != nil {
			t.Fatal(err)
		}
		if np.Namespace != d.sts.Namespace || !sel.Matches(podLabels) {
			continue
		}
		selecting++
		if !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
			t.Errorf("NetworkPolicy %s does not restrict ingress", np.Name)
		}
		for i, rule := range np.Spec.Ingress {
			for _, name := range []string{"grpc", "http", "drift"} {
				if len(rule.From) == 0 && opens(rule.Ports, name, port(t, d.c, name)) {
					open[name] = true
				}
			}
			if !opens(rule.Ports, "raft", raftPort.IntValue()) {
				continue
			}
			if len(rule.From) == 0 {
				t.Errorf("NetworkPolicy %s ingress[%d] opens the raft port to everyone", np.Name, i)
			}
			for _, peer := range rule.From {
				ok := peer.PodSelector != nil && peer.NamespaceSelector == nil && peer.IPBlock == nil
				if ok {
					ps, err := metav1.LabelSelectorAsSelector(peer.PodSelector)
					ok = err == nil && !ps.Empty() && ps.Matches(podLabels)
				}
				if !ok {
					t.Errorf("NetworkPolicy %s ingress[%d] opens the raft port to %+v, not only the StatefulSet's pods", np.Name, i, peer)
				}
			}
		}
	}
	if selecting == 0 {
		t.Fatal("no NetworkPolicy selects the StatefulSet's pods")
	}
	for _, name := range []string{"grpc", "http", "drift"} {
		if !open[name] {
			t.Errorf("the %s port is not open to clients", name)
		}
	}
}

func (d *deployment) checkWebhook(t *testing.T) {
	wh := d.hook.Webhooks[0]
	if wh.FailurePolicy == nil || *wh.FailurePolicy != admissionregistrationv1.Ignore ||
		wh.TimeoutSeconds == nil || *wh.TimeoutSeconds != 5 ||
		wh.SideEffects == nil || *wh.SideEffects != admissionregistrationv1.SideEffectClassNoneOnDryRun {
		t.Errorf("webhook: failurePolicy %v, timeoutSeconds %v, sideEffects %v; want Ignore, 5, NoneOnDryRun", wh.FailurePolicy, wh.TimeoutSeconds, wh.SideEffects)
	}
	ref := wh.ClientConfig.Service
	if p := ref.Path; p == nil || *p != admission.Path {
		t.Errorf("webhook path %v, want %s", p, admission.Path)
	}
	if ref.Namespace != d.sts.Namespace {
		t.Errorf("webhook service namespace %q, want %q", ref.Namespace, d.sts.Namespace)
	}
	// The webhook's service port leads to the container's drift port.
	var target string
	for _, p := range d.webhookService.Spec.Ports {
		if ref.Port != nil && p.Port == *ref.Port {
			target = p.TargetPort.String()
		}
	}
	if target != "drift" {
		t.Errorf("webhook port %v of service %s targets %q, want the container port drift", ref.Port, d.webhookService.Name, target)
	}
}

// certificate is the part of a cert-manager Certificate the test reads.
type certificate struct {
	Metadata metav1.ObjectMeta `json:"metadata"`
	Spec     struct {
		SecretName  string   `json:"secretName"`
		IsCA        bool     `json:"isCA"`
		DNSNames    []string `json:"dnsNames"`
		IPAddresses []string `json:"ipAddresses"`
		URIs        []string `json:"uris"`
		Usages      []string `json:"usages"`
		IssuerRef   struct {
			Name  string `json:"name"`
			Kind  string `json:"kind"`
			Group string `json:"group"`
		} `json:"issuerRef"`
	} `json:"spec"`
}

// issuer is the part of a cert-manager Issuer the test reads.
type issuer struct {
	Metadata metav1.ObjectMeta `json:"metadata"`
	Spec     struct {
		CA *struct {
			SecretName string `json:"secretName"`
		} `json:"ca"`
	} `json:"spec"`
}

func decodeAll[T any](t *testing.T, ms []manifest, kind string) []T {
	t.Helper()
	var out []T
	for _, m := range ms {
		if m.obj.GetKind() == kind {
			var v T
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(m.obj.Object, &v); err != nil {
				t.Fatalf("%v: %v", m, err)
			}
			out = append(out, v)
		}
	}
	return out
}

// checkCertificates: the cert-manager component issues the Secrets the
// config reads, and each certificate names what its plane needs.
func (d *deployment) checkCertificates(t *testing.T) {
	ms := readManifests(t, filepath.Join("components", "cert-manager"))
	certs := decodeAll[certificate](t, ms, "Certificate")
	issuers := decodeAll[issuer](t, ms, "Issuer")
	bySecret := func(secret string) *certificate {
		for i := range certs {
			if certs[i].Spec.SecretName == secret {
				return &certs[i]
			}
		}
		t.Fatalf("no Certificate writes Secret %s", secret)
		return nil
	}
	// caOf is the CA Certificate behind a leaf's issuer.
	caOf := func(c *certificate) *certificate {
		ref := c.Spec.IssuerRef
		if ref.Kind != "Issuer" || ref.Group != "cert-manager.io" {
			t.Fatalf("Certificate %s: issuer %+v, want an Issuer of this component", c.Metadata.Name, ref)
		}
		for _, is := range issuers {
			if is.Metadata.Name == ref.Name && is.Spec.CA != nil {
				ca := bySecret(is.Spec.CA.SecretName)
				if !ca.Spec.IsCA {
					t.Errorf("Issuer %s signs with %s, which is no CA", ref.Name, ca.Metadata.Name)
				}
				return ca
			}
		}
		t.Fatalf("Certificate %s: no CA Issuer %s", c.Metadata.Name, ref.Name)
		return nil
	}

	cfg := d.loadConfig(t, d.pods()[0], d.all)
	spec := d.sts.Spec.Template.Spec
	node := bySecret(secretOf(t, spec, d.c, "raft.tls.cert_file", cfg.Raft.TLS.CertFile))
	serving := bySecret(secretOf(t, spec, d.c, "http.tls.cert_file", cfg.HTTP.TLS.CertFile))
	for _, f := range []string{cfg.Raft.TLS.ClientCAFile, cfg.HTTP.TLS.CertFile, cfg.HTTP.TLS.KeyFile, cfg.Raft.TLS.CertFile, cfg.Raft.TLS.KeyFile} {
		if b := filepath.Base(f); b != "ca.crt" && b != "tls.crt" && b != "tls.key" {
			t.Errorf("%s is not a key cert-manager writes (tls.crt, tls.key, ca.crt)", f)
		}
	}

	// The node certificate: every replica's node identity and peer name.
	var wantURIs []string
	for _, pod := range d.pods() {
		wantURIs = append(wantURIs, fmt.Sprintf("spiffe://%s/node/%s", cfg.Cluster.TrustDomain, pod))
	}
	if got := slices.Sorted(slices.Values(node.Spec.URIs)); !slices.Equal(got, wantURIs) {
		t.Errorf("node certificate %s names URIs %v, want exactly the replicas' %v", node.Metadata.Name, got, wantURIs)
	}
	for _, p := range cfg.Raft.Peers {
		host, _ := addrPort(t, "raft.peers", p.Address)
		if !slices.Contains(node.Spec.DNSNames, host) {
			t.Errorf("node certificate %s lacks DNS name %s, which its peers dial", node.Metadata.Name, host)
		}
	}
	for _, u := range []string{"server auth", "client auth"} {
		if !slices.Contains(node.Spec.Usages, u) {
			t.Errorf("node certificate %s lacks usage %q: a node is server and client on the peer plane", node.Metadata.Name, u)
		}
	}

	// The serving certificate: the services' names and each pod's
	// advertised name; no client auth.
	want := []string{"localhost"}
	for _, svc := range []corev1.Service{d.client, d.admin, d.webhookService} {
		want = append(want, svc.Name+"."+svc.Namespace+".svc")
	}
	for _, pod := range d.pods() {
		c := d.loadConfig(t, pod, d.all)
		for _, adv := range []string{c.HTTPAdvertise(), c.GRPCAdvertise()} {
			host, _ := addrPort(t, "advertise", adv)
			want = append(want, host)
		}
	}
	for _, name := range want {
		if !slices.Contains(serving.Spec.DNSNames, name) {
			t.Errorf("serving certificate %s lacks DNS name %s", serving.Metadata.Name, name)
		}
	}
	if slices.Contains(serving.Spec.Usages, "client auth") || len(serving.Spec.URIs) > 0 {
		t.Errorf("serving certificate %s: usages %v, URIs %v; it must open no client door", serving.Metadata.Name, serving.Spec.Usages, serving.Spec.URIs)
	}

	// The peer CA signs node certificates only.
	peerCA := caOf(node)
	for i := range certs {
		if c := &certs[i]; c != node && !c.Spec.IsCA && caOf(c) == peerCA {
			t.Errorf("Certificate %s is signed by the peer CA %s, which must sign node certificates only", c.Metadata.Name, peerCA.Metadata.Name)
		}
	}

	// The webhook's CA is injected from the serving certificate, which the
	// drift listener presents.
	if ann := d.hook.Annotations["cert-manager.io/inject-ca-from"]; ann != serving.Metadata.Namespace+"/"+serving.Metadata.Name {
		t.Errorf("webhook cert-manager.io/inject-ca-from = %q, want the serving certificate %s/%s", ann, serving.Metadata.Namespace, serving.Metadata.Name)
	}
}

// checkSecretsDocumented: docs/operations.md creates every Secret the pods
// mount, for deployments without cert-manager.
func (d *deployment) checkSecretsDocumented(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	created := map[string]bool{}
	for _, m := range regexp.MustCompile(`create secret (?:generic|tls) (\S+)`).FindAllStringSubmatch(string(doc), -1) {
		created[m[1]] = true
	}
	for _, v := range d.sts.Spec.Template.Spec.Volumes {
		if v.Secret != nil && !created[v.Secret.SecretName] {
			t.Errorf("docs/operations.md does not show how to create Secret %s", v.Secret.SecretName)
		}
	}
}
