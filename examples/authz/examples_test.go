package authz

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extauthzv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_authz/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// The contract of `policyd authz` (docs/authz.md) that the examples follow.
const (
	authzGRPCAddr   = "127.0.0.1:9191" // --grpc-addr default
	authzHTTPAddr   = "127.0.0.1:9192" // --http-addr default
	maxBodyBytes    = 1048576          // --max-body-bytes default
	maxAuthzTimeout = time.Second      // longer would hold requests on a stuck sidecar
)

// authzFlags are the flags `policyd authz` takes, so that a misspelt flag in
// pod.yaml fails here rather than in a crash-looping pod.
var authzFlags = []string{
	"--servers", "--transport", "--token-file", "--org", "--team", "--employee", "--grace",
	"--ca-file", "--cert-file", "--key-file", "--grpc-addr", "--http-addr",
	"--serve-cert-file", "--serve-key-file", "--serve-client-ca-file",
	"--max-header-bytes", "--max-body-bytes", "--max-in-flight", "--cel-cost-limit",
	"--max-conns", "--probe-addr",
}

// mutation corrupts an example to prove its check catches the corruption.
type mutation struct {
	name     string
	old, new string // replace the first old with new; empty old: unchanged
	wantErr  string // a substring of the error; empty: no error
}

// runMutations runs check on file with each mutation applied.
func runMutations(t *testing.T, file string, check func([]byte) error, tests []mutation) {
	t.Helper()
	orig, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := string(orig)
			if tt.old != "" {
				if !strings.Contains(src, tt.old) {
					t.Fatalf("%s does not contain %q: the mutation would test nothing", file, tt.old)
				}
				src = strings.Replace(src, tt.old, tt.new, 1)
			}
			err := check([]byte(src))
			t.Logf("check: %v", err) // with -v, shows which check caught it
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("check %s: %v", file, err)
			case tt.wantErr != "" && err == nil:
				t.Fatalf("check %s: no error, want one containing %q", file, tt.wantErr)
			case tt.wantErr != "" && !strings.Contains(err.Error(), tt.wantErr):
				t.Fatalf("check %s: %v\nwant an error containing %q", file, err, tt.wantErr)
			}
		})
	}
}

func TestEnvoy(t *testing.T) {
	runMutations(t, "envoy.yaml", checkEnvoy, []mutation{
		{name: "as shipped"},
		{name: "typo in a bootstrap field", old: "connect_timeout: 0.25s", new: "connect_timout: 0.25s", wantErr: "unknown field"},
		{name: "typo in a typed config field", old: "failure_mode_allow: false", new: "failure_mode_alow: false", wantErr: "unknown field"},
		{name: "typo in a nested typed config field", old: "allow_partial_message: false", new: "allow_partial_mesage: false", wantErr: "unknown field"},
		{name: "unknown typed config type", old: "router.v3.Router", new: "router.v3.Routr", wantErr: "unable to resolve"},
		{name: "duplicate key", old: "merge_slashes: true", new: "merge_slashes: true\n                merge_slashes: false", wantErr: "already set"},
		{name: "invalid value in a typed config", old: "max_request_bytes: 1048576", new: "max_request_bytes: 0", wantErr: "MaxRequestBytes"},
		{name: "invalid port", old: "port_value: 9191", new: "port_value: 70000", wantErr: "PortValue"},
		{name: "fail open", old: "failure_mode_allow: false", new: "failure_mode_allow: true", wantErr: "fails open"},
		{name: "partial body", old: "allow_partial_message: false", new: "allow_partial_message: true", wantErr: "partial"},
		{name: "body limit", old: "max_request_bytes: 1048576", new: "max_request_bytes: 4096", wantErr: "max_request_bytes"},
		{name: "no timeout", old: "timeout: 0.25s", new: "", wantErr: "timeout"},
		{name: "wrong port", old: "port_value: 9191", new: "port_value: 9192", wantErr: authzGRPCAddr},
		{name: "wrong cluster", old: "cluster_name: policyd-authz\n", new: "cluster_name: app\n", wantErr: authzGRPCAddr},
		{name: "HTTP/1.1 upstream", old: "http2_protocol_options: {}", new: "http_protocol_options: {}", wantErr: "HTTP/2"},
		{name: "DNS cluster", old: "type: STATIC\n      connect_timeout: 0.25s", new: "type: STRICT_DNS\n      connect_timeout: 0.25s", wantErr: "STATIC"},
		{name: "router first", old: "- name: envoy.filters.http.ext_authz\n", new: "- name: envoy.filters.http.router\n                    typed_config:\n                      \"@type\": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router\n                  - name: envoy.filters.http.ext_authz\n", wantErr: "router"},
	})
}

// TestEnvoyTypedConfigs checks that every typed config was unpacked and
// validated, so the walk in parseEnvoy is not vacuous.
func TestEnvoyTypedConfigs(t *testing.T) {
	src, err := os.ReadFile("envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	_, typed, err := parseEnvoy(src)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range typed {
		got = append(got, string(m.ProtoReflect().Descriptor().FullName()))
	}
	slices.Sort(got)
	want := []string{
		"envoy.extensions.filters.http.ext_authz.v3.ExtAuthz",
		"envoy.extensions.filters.http.ext_authz.v3.ExtAuthzPerRoute",
		"envoy.extensions.filters.http.router.v3.Router",
		"envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
		"envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("typed configs (-want +got):\n%s", diff)
	}
}

// parseEnvoy decodes an Envoy bootstrap strictly (protojson rejects unknown
// fields, also inside typed configs) and validates it and every typed config
// in it, which the bootstrap's own validation does not look into.
func parseEnvoy(src []byte) (*bootstrapv3.Bootstrap, []proto.Message, error) {
	js, err := yaml.YAMLToJSONStrict(src)
	if err != nil {
		return nil, nil, fmt.Errorf("envoy.yaml: %w", err)
	}
	b := &bootstrapv3.Bootstrap{}
	if err := protojson.Unmarshal(js, b); err != nil {
		return nil, nil, fmt.Errorf("decode bootstrap: %w", err)
	}
	if err := b.ValidateAll(); err != nil {
		return nil, nil, fmt.Errorf("validate bootstrap: %w", err)
	}
	typed, err := unpackAll(b.ProtoReflect())
	if err != nil {
		return nil, nil, err
	}
	for _, m := range typed {
		v, ok := m.(interface{ ValidateAll() error })
		if !ok {
			return nil, nil, fmt.Errorf("%s has no validation", m.ProtoReflect().Descriptor().FullName())
		}
		if err := v.ValidateAll(); err != nil {
			return nil, nil, fmt.Errorf("validate %s: %w", m.ProtoReflect().Descriptor().FullName(), err)
		}
	}
	return b, typed, nil
}

// unpackAll returns every message packed in an Any inside m, at any depth.
func unpackAll(m protoreflect.Message) ([]proto.Message, error) {
	var out []proto.Message
	var walk func(protoreflect.Message) error
	walk = func(m protoreflect.Message) error {
		if a, ok := m.Interface().(*anypb.Any); ok {
			inner, err := a.UnmarshalNew()
			if err != nil {
				return fmt.Errorf("unpack %s: %w", a.GetTypeUrl(), err)
			}
			out = append(out, inner)
			return walk(inner.ProtoReflect())
		}
		var err error
		m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
			switch {
			case fd.IsMap():
				if fd.MapValue().Message() != nil {
					v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
						err = walk(mv.Message())
						return err == nil
					})
				}
			case fd.IsList():
				if fd.Message() != nil {
					for i := range v.List().Len() {
						if err = walk(v.List().Get(i).Message()); err != nil {
							break
						}
					}
				}
			case fd.Message() != nil:
				err = walk(v.Message())
			}
			return err == nil
		})
		return err
	}
	return out, walk(m)
}

// checkEnvoy checks that every HTTP listener asks policyd, before routing,
// over HTTP/2 to the --grpc-addr, and fails closed.
func checkEnvoy(src []byte) error {
	b, _, err := parseEnvoy(src)
	if err != nil {
		return err
	}
	clusters := map[string]*clusterv3.Cluster{}
	for _, c := range b.GetStaticResources().GetClusters() {
		clusters[c.GetName()] = c
	}
	var problems []error
	hcms := 0
	for _, l := range b.GetStaticResources().GetListeners() {
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				hcm := &hcmv3.HttpConnectionManager{}
				if f.GetTypedConfig().MessageIs(hcm) {
					hcms++
					if err := f.GetTypedConfig().UnmarshalTo(hcm); err != nil {
						return err
					}
					problems = append(problems, checkHTTPFilters(l.GetName(), hcm.GetHttpFilters(), clusters)...)
				}
			}
		}
	}
	if hcms == 0 {
		problems = append(problems, errors.New("no http_connection_manager"))
	}
	return errors.Join(problems...)
}

// checkHTTPFilters checks one listener's HTTP filters.
func checkHTTPFilters(listener string, filters []*hcmv3.HttpFilter, clusters map[string]*clusterv3.Cluster) []error {
	var problems []error
	fail := func(format string, args ...any) {
		problems = append(problems, fmt.Errorf("listener %s: "+format, append([]any{listener}, args...)...))
	}
	var authzAt, routerAt []int
	ea := &extauthzv3.ExtAuthz{}
	for i, f := range filters {
		switch {
		case f.GetTypedConfig().MessageIs(ea):
			authzAt = append(authzAt, i)
			if err := f.GetTypedConfig().UnmarshalTo(ea); err != nil {
				return []error{err}
			}
		case f.GetTypedConfig().MessageIs(&routerv3.Router{}):
			routerAt = append(routerAt, i)
		}
	}
	if len(authzAt) == 0 {
		fail("no ext_authz filter: requests are not checked")
		return problems
	}
	// A router before ext_authz would send requests on unchecked.
	if len(authzAt) != 1 || !slices.Equal(routerAt, []int{len(filters) - 1}) {
		fail("ext_authz at %v, router at %v of %d filters: want one of each, the router last", authzAt, routerAt, len(filters))
	}
	if ea.GetTransportApiVersion() != corev3.ApiVersion_V3 {
		fail("transport_api_version %v, want V3", ea.GetTransportApiVersion())
	}
	if ea.GetFailureModeAllow() {
		fail("failure_mode_allow is true: it fails open")
	}
	body := ea.GetWithRequestBody()
	if body.GetMaxRequestBytes() != maxBodyBytes {
		fail("with_request_body.max_request_bytes %d, want --max-body-bytes %d", body.GetMaxRequestBytes(), maxBodyBytes)
	}
	if body.GetAllowPartialMessage() {
		fail("with_request_body.allow_partial_message: a policy would see a partial body")
	}
	gs := ea.GetGrpcService()
	if d := gs.GetTimeout(); d == nil || d.AsDuration() <= 0 || d.AsDuration() > maxAuthzTimeout {
		fail("grpc_service.timeout %v, want one up to %v", d.AsDuration(), maxAuthzTimeout)
	}
	name := gs.GetEnvoyGrpc().GetClusterName()
	c, ok := clusters[name]
	if !ok {
		fail("ext_authz cluster %q is not defined", name)
		return problems
	}
	if err := checkAuthzCluster(c); err != nil {
		fail("ext_authz cluster %q: %v", name, err)
	}
	return problems
}

// checkAuthzCluster checks that c reaches --grpc-addr over HTTP/2.
func checkAuthzCluster(c *clusterv3.Cluster) error {
	var problems []error
	if c.GetType() != clusterv3.Cluster_STATIC {
		problems = append(problems, fmt.Errorf("type %v, want STATIC", c.GetType()))
	}
	var addrs []string
	for _, e := range c.GetLoadAssignment().GetEndpoints() {
		for _, lb := range e.GetLbEndpoints() {
			sa := lb.GetEndpoint().GetAddress().GetSocketAddress()
			addrs = append(addrs, net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue()))))
		}
	}
	if !slices.Equal(addrs, []string{authzGRPCAddr}) {
		problems = append(problems, fmt.Errorf("endpoints %v, want [%s]", addrs, authzGRPCAddr))
	}
	opts := &upstreamhttpv3.HttpProtocolOptions{}
	a, ok := c.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
	if !ok || a.UnmarshalTo(opts) != nil || opts.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
		problems = append(problems, errors.New("not explicitly HTTP/2, which gRPC needs"))
	}
	return errors.Join(problems...)
}

// yamlDocs splits a YAML stream into its documents.
func yamlDocs(src []byte) ([][]byte, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(src)))
	var docs [][]byte
	for {
		d, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("split YAML: %w", err)
		}
		docs = append(docs, d)
	}
}

// The Istio documents, mirroring only the fields istio.yaml uses: there are
// no Istio types here, and decoding strictly into these catches a misspelt
// field. A field added to istio.yaml must be added here too.
type (
	istioOperator struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Spec       struct {
			MeshConfig struct {
				ExtensionProviders []extensionProvider `json:"extensionProviders"`
			} `json:"meshConfig"`
		} `json:"spec"`
	}
	extensionProvider struct {
		Name              string        `json:"name"`
		EnvoyExtAuthzGrpc *extAuthzGrpc `json:"envoyExtAuthzGrpc"`
	}
	extAuthzGrpc struct {
		Service                   string `json:"service"`
		Port                      int    `json:"port"`
		Timeout                   string `json:"timeout"`
		FailOpen                  bool   `json:"failOpen"`
		StatusOnError             string `json:"statusOnError"`
		IncludeRequestBodyInCheck struct {
			MaxRequestBytes     int  `json:"maxRequestBytes"`
			AllowPartialMessage bool `json:"allowPartialMessage"`
			PackAsBytes         bool `json:"packAsBytes"`
		} `json:"includeRequestBodyInCheck"`
	}
	serviceEntry struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name string `json:"name"`
		} `json:"metadata"`
		Spec struct {
			Hosts     []string `json:"hosts"`
			ExportTo  []string `json:"exportTo"`
			Endpoints []struct {
				Address string `json:"address"`
			} `json:"endpoints"`
			Ports []struct {
				Name     string `json:"name"`
				Number   int    `json:"number"`
				Protocol string `json:"protocol"`
			} `json:"ports"`
			Resolution string `json:"resolution"`
		} `json:"spec"`
	}
	authorizationPolicy struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name string `json:"name"`
		} `json:"metadata"`
		Spec struct {
			Selector struct {
				MatchLabels map[string]string `json:"matchLabels"`
			} `json:"selector"`
			Action   string `json:"action"`
			Provider struct {
				Name string `json:"name"`
			} `json:"provider"`
			Rules []struct {
				To []struct {
					Operation struct {
						NotPaths []string `json:"notPaths"`
					} `json:"operation"`
				} `json:"to"`
			} `json:"rules"`
		} `json:"spec"`
	}
)

func TestIstio(t *testing.T) {
	runMutations(t, "istio.yaml", checkIstio, []mutation{
		{name: "as shipped"},
		{name: "typo in a field", old: "envoyExtAuthzGrpc:", new: "envoyExtAuthGrpc:", wantErr: "unknown field"},
		{name: "not CUSTOM", old: "action: CUSTOM", new: "action: ALLOW", wantErr: "CUSTOM"},
		{name: "other provider", old: "    name: policyd-authz\n  rules:", new: "    name: opa\n  rules:", wantErr: "provider"},
		{name: "fail open", old: "failOpen: false", new: "failOpen: true", wantErr: "failOpen"},
		{name: "wrong port", old: "number: 9191", new: "number: 9192", wantErr: "9191"},
		{name: "not loopback", old: "address: 127.0.0.1", new: "address: 10.0.0.1", wantErr: "127.0.0.1"},
		{name: "other pods", old: "      app: orders\n  action", new: "      app: payments\n  action", wantErr: "pod.yaml"},
	})
}

// checkIstio checks that the AuthorizationPolicy sends pod.yaml's pods to a
// provider that reaches --grpc-addr in the same pod and fails closed.
func checkIstio(src []byte) error {
	docs, err := yamlDocs(src)
	if err != nil {
		return err
	}
	if len(docs) != 3 {
		return fmt.Errorf("%d documents, want IstioOperator, ServiceEntry, AuthorizationPolicy", len(docs))
	}
	var (
		op istioOperator
		se serviceEntry
		ap authorizationPolicy
	)
	for i, d := range docs {
		if err := yaml.UnmarshalStrict(d, []any{&op, &se, &ap}[i]); err != nil {
			return fmt.Errorf("document %d: %w", i+1, err)
		}
	}
	var problems []error
	fail := func(format string, args ...any) { problems = append(problems, fmt.Errorf(format, args...)) }
	if got := []string{op.Kind, se.Kind, ap.Kind}; !slices.Equal(got, []string{"IstioOperator", "ServiceEntry", "AuthorizationPolicy"}) {
		fail("kinds %v", got)
	}
	if ap.Spec.Action != "CUSTOM" {
		fail("AuthorizationPolicy action %q, want CUSTOM", ap.Spec.Action)
	}
	labels, err := podLabels()
	if err != nil {
		return err
	}
	if !cmp.Equal(ap.Spec.Selector.MatchLabels, labels) {
		fail("AuthorizationPolicy selects %v, but pod.yaml's pods have labels %v", ap.Spec.Selector.MatchLabels, labels)
	}
	i := slices.IndexFunc(op.Spec.MeshConfig.ExtensionProviders, func(p extensionProvider) bool {
		return p.Name == ap.Spec.Provider.Name
	})
	if i < 0 || op.Spec.MeshConfig.ExtensionProviders[i].EnvoyExtAuthzGrpc == nil {
		fail("AuthorizationPolicy names provider %q, which is not an envoyExtAuthzGrpc extension provider", ap.Spec.Provider.Name)
		return errors.Join(problems...)
	}
	p := op.Spec.MeshConfig.ExtensionProviders[i].EnvoyExtAuthzGrpc
	if p.FailOpen {
		fail("provider failOpen is true: it fails open")
	}
	if b := p.IncludeRequestBodyInCheck; b.MaxRequestBytes != maxBodyBytes || b.AllowPartialMessage {
		fail("provider body %d bytes (partial %t), want %d, not partial", b.MaxRequestBytes, b.AllowPartialMessage, maxBodyBytes)
	}
	if d, err := time.ParseDuration(p.Timeout); err != nil || d <= 0 || d > maxAuthzTimeout {
		fail("provider timeout %q, want one up to %v", p.Timeout, maxAuthzTimeout)
	}
	// The provider's service must be the ServiceEntry for loopback:9191.
	_, port, _ := net.SplitHostPort(authzGRPCAddr)
	var addrs []string
	for _, e := range se.Spec.Endpoints {
		for _, pt := range se.Spec.Ports {
			addrs = append(addrs, net.JoinHostPort(e.Address, strconv.Itoa(pt.Number)))
		}
	}
	if !slices.Contains(se.Spec.Hosts, p.Service) || strconv.Itoa(p.Port) != port || !slices.Equal(addrs, []string{authzGRPCAddr}) {
		fail("provider %s:%d, ServiceEntry hosts %v at %v: want the provider to reach %s", p.Service, p.Port, se.Spec.Hosts, addrs, authzGRPCAddr)
	}
	if se.Spec.Resolution != "STATIC" || len(se.Spec.Ports) != 1 || se.Spec.Ports[0].Protocol != "GRPC" {
		fail("ServiceEntry resolution %q ports %v, want STATIC and one GRPC port", se.Spec.Resolution, se.Spec.Ports)
	}
	return errors.Join(problems...)
}

func TestPod(t *testing.T) {
	runMutations(t, "pod.yaml", checkPod, []mutation{
		{name: "as shipped"},
		{name: "typo in a field", old: "readOnlyRootFilesystem: true\n            capabilities:\n              drop: [\"ALL\"]\n          volumeMounts", new: "readOnlyRootFilesytem: true\n            capabilities:\n              drop: [\"ALL\"]\n          volumeMounts", wantErr: "unknown field"},
		{name: "typo in a flag", old: "--token-file=", new: "--tokenfile=", wantErr: "--tokenfile"},
		{name: "no token", old: "            - --token-file=/etc/policyd/token/token\n", new: "", wantErr: "--token-file"},
		{name: "token not mounted", old: "--token-file=/etc/policyd/token/token", new: "--token-file=/tmp/token", wantErr: "not on a Secret"},
		{name: "startup on /healthz", old: "path: /readyz", new: "path: /healthz", wantErr: "/readyz"},
		{name: "probe on the wrong port", old: "port: authz-probe\n            periodSeconds: 2", new: "port: authz-http\n            periodSeconds: 2", wantErr: "9193"},
		{name: "port moved", old: "containerPort: 9193", new: "containerPort: 9194", wantErr: "9193"},
		{name: "no probe listener", old: "            - --probe-addr=0.0.0.0:9193\n", new: "", wantErr: "--probe-addr"},
		{name: "readiness on /readyz", old: "          livenessProbe:", new: "          readinessProbe:\n            httpGet: {path: /readyz, port: authz-probe}\n          livenessProbe:", wantErr: "readinessProbe"},
		{name: "writable root", old: "readOnlyRootFilesystem: true\n            capabilities:\n              drop: [\"ALL\"]\n          volumeMounts", new: "readOnlyRootFilesystem: false\n            capabilities:\n              drop: [\"ALL\"]\n          volumeMounts", wantErr: "readOnlyRootFilesystem"},
		{name: "no memory limit", old: "            limits:\n              memory: 128Mi\n", new: "", wantErr: "memory"},
	})
}

// loadDeployment decodes pod.yaml's Deployment strictly.
func loadDeployment(src []byte) (*appsv1.Deployment, error) {
	d := &appsv1.Deployment{}
	if err := yaml.UnmarshalStrict(src, d); err != nil {
		return nil, fmt.Errorf("pod.yaml: %w", err)
	}
	return d, nil
}

// podLabels returns the labels of pod.yaml's pods.
func podLabels() (map[string]string, error) {
	src, err := os.ReadFile("pod.yaml")
	if err != nil {
		return nil, err
	}
	d, err := loadDeployment(src)
	if err != nil {
		return nil, err
	}
	return d.Spec.Template.Labels, nil
}

// checkPod checks the sidecar container: its flags exist, its token comes
// from a Secret, its probes reach /readyz and /healthz on --http-addr's port,
// and it is locked down and bounded.
func checkPod(src []byte) error {
	d, err := loadDeployment(src)
	if err != nil {
		return err
	}
	if d.Kind != "Deployment" || d.APIVersion != "apps/v1" {
		return fmt.Errorf("%s %s, want apps/v1 Deployment", d.APIVersion, d.Kind)
	}
	pod := d.Spec.Template.Spec
	i := slices.IndexFunc(pod.Containers, func(c corev1.Container) bool { return slices.Contains(c.Args, "authz") })
	if i < 0 {
		return errors.New("no container runs `policyd authz`")
	}
	c := pod.Containers[i]
	var problems []error
	fail := func(format string, args ...any) {
		problems = append(problems, fmt.Errorf("container %s: "+format, append([]any{c.Name}, args...)...))
	}
	if !strings.HasPrefix(c.Image, "policyd:") || len(c.Command) != 0 || c.Args[0] != "authz" {
		fail("image %q command %v args %v, want the policyd image's entrypoint with args authz ...", c.Image, c.Command, c.Args)
	}
	flags := map[string]string{}
	for _, a := range c.Args[1:] {
		name, value, _ := strings.Cut(a, "=")
		if !slices.Contains(authzFlags, name) {
			fail("unknown flag %s", name)
		}
		flags[name] = value
	}
	if flags["--servers"] == "" {
		fail("no --servers")
	}
	if tok := flags["--token-file"]; tok == "" {
		fail("no --token-file")
	} else if !onSecret(pod, c, tok) {
		fail("--token-file %s is not on a Secret or projected volume", tok)
	}

	// The kubelet probes the pod IP: only --probe-addr (any address,
	// /healthz and /readyz only) is reachable without a certificate.
	probeAddr := flags["--probe-addr"]
	if probeAddr == "" {
		fail("no --probe-addr: the kubelet cannot reach the loopback --http-addr")
	}
	_, wantPort, err := net.SplitHostPort(probeAddr)
	if err != nil {
		fail("--probe-addr %q: %v", probeAddr, err)
	}
	for _, p := range []struct {
		what  string
		probe *corev1.Probe
		path  string
	}{
		{"startupProbe", c.StartupProbe, "/readyz"},
		{"livenessProbe", c.LivenessProbe, "/healthz"},
	} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			fail("%s: want GET %s", p.what, p.path)
			continue
		}
		g := p.probe.HTTPGet
		if got := containerPort(c, g.Port); g.Path != p.path || got != wantPort || (g.Scheme != "" && g.Scheme != corev1.URISchemeHTTP) {
			fail("%s: %s on port %s (scheme %q), want HTTP %s on %s (--probe-addr)", p.what, g.Path, got, g.Scheme, p.path, wantPort)
		}
	}
	// Readiness on /readyz would take every pod out of its Service when
	// the cluster is unreachable, while the cache still decides.
	if r := c.ReadinessProbe; r != nil && r.HTTPGet != nil && r.HTTPGet.Path == "/readyz" {
		fail("readinessProbe on /readyz: a policyd outage would become an outage of the app")
	}

	sc := c.SecurityContext
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		fail("securityContext.readOnlyRootFilesystem not true")
	}
	nonRoot := (sc != nil && sc.RunAsNonRoot != nil && *sc.RunAsNonRoot) ||
		(pod.SecurityContext != nil && pod.SecurityContext.RunAsNonRoot != nil && *pod.SecurityContext.RunAsNonRoot)
	if !nonRoot {
		fail("runAsNonRoot not true")
	}
	if c.Resources.Limits.Memory().IsZero() || c.Resources.Requests.Cpu().IsZero() {
		fail("resources: want a memory limit and a CPU request")
	}
	return errors.Join(problems...)
}

// containerPort resolves a probe's port, by number or by the name of one of
// c's ports.
func containerPort(c corev1.Container, p intstr.IntOrString) string {
	if p.Type == intstr.Int {
		return p.String()
	}
	for _, cp := range c.Ports {
		if cp.Name == p.StrVal {
			return strconv.Itoa(int(cp.ContainerPort))
		}
	}
	return "(no port named " + p.StrVal + ")"
}

// onSecret reports whether file is under one of c's mounts of a Secret or
// projected volume.
func onSecret(pod corev1.PodSpec, c corev1.Container, file string) bool {
	for _, m := range c.VolumeMounts {
		if !strings.HasPrefix(file, strings.TrimSuffix(m.MountPath, "/")+"/") {
			continue
		}
		for _, v := range pod.Volumes {
			if v.Name == m.Name && (v.Secret != nil || v.Projected != nil) {
				return true
			}
		}
	}
	return false
}
