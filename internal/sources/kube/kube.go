package kube

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/policyd/policyd/api/kubernetes/v1alpha1"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/sources"
)

// Config tunes the driver; the zero value takes every default.
type Config struct {
	// StatusInterval is the least time between two status writes of one
	// object, and how often a rollout not yet final is looked at again
	// (default 1s).
	StatusInterval time.Duration
	// StatusWriters is how many status writes run at once (default 8).
	StatusWriters int
	// QPS and Burst bound the driver's requests to the API server (default
	// 1000 and 1000): 1,000 objects applied at once take two writes each,
	// within seconds.
	QPS   float32
	Burst int
}

func (c Config) normalized() Config {
	if c.StatusInterval <= 0 {
		c.StatusInterval = time.Second
	}
	if c.StatusWriters <= 0 {
		c.StatusWriters = 8
	}
	if c.QPS <= 0 {
		c.QPS = 1000
	}
	if c.Burst <= 0 {
		c.Burst = 1000
	}
	return c
}

// kinds are the resources the driver reads, in the order it lists them.
var kinds = []struct {
	kind string
	gvr  schema.GroupVersionResource
}{
	{policy.KindToolPolicy, v1alpha1.ToolPolicies},
	{policy.KindValidatingPolicy, v1alpha1.ValidatingPolicies},
}

func resourceOf(kind string) (schema.GroupVersionResource, bool) {
	for _, k := range kinds {
		if k.kind == kind {
			return k.gvr, true
		}
	}
	return schema.GroupVersionResource{}, false
}

// Driver is the Kubernetes source's driver. Watch runs it for one
// leadership term; Observe and Report work between.
type Driver struct {
	cfg    Config
	client dynamic.Interface
	fleet  sources.Fleet
	logger *slog.Logger

	mu        sync.Mutex
	informers map[string]cache.SharedIndexInformer // by kind, while Watch runs
	status    *statusWriter
}

var _ sources.Driver = (*Driver)(nil)

// New returns a driver reading the API server rc points at. fleet answers
// how far each policy has rolled out.
func New(cfg Config, rc *rest.Config, fleet sources.Fleet, logger *slog.Logger) (*Driver, error) {
	if rc == nil {
		return nil, fmt.Errorf("kubernetes source: no API server configuration")
	}
	if fleet == nil {
		return nil, fmt.Errorf("kubernetes source: no fleet")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	cfg = cfg.normalized()
	rc = rest.CopyConfig(rc)
	rc.QPS, rc.Burst = cfg.QPS, cfg.Burst
	if rc.UserAgent == "" {
		rc.UserAgent = "policyd-source-kubernetes"
	}
	client, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes source: client: %w", err)
	}
	d := &Driver{cfg: cfg, client: client, fleet: fleet, logger: logger}
	d.status = newStatusWriter(cfg, client, fleet, logger, d.cached)
	return d, nil
}

// Name is sources.Kubernetes.
func (d *Driver) Name() string { return sources.Kubernetes }

// Watch starts the informers and the status writer, and runs until ctx
// ends. It calls changed at start, once both caches have synced, and on
// every change of an object's spec or adopt annotation (not on status
// writes, which are the driver's own).
func (d *Driver) Watch(ctx context.Context, changed func()) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	factory := dynamicinformer.NewDynamicSharedInformerFactory(d.client, 0)
	infs := make(map[string]cache.SharedIndexInformer, len(kinds))
	synced := make([]cache.InformerSynced, 0, len(kinds))
	for _, k := range kinds {
		inf := factory.ForResource(k.gvr).Informer()
		if _, err := inf.AddEventHandler(d.handler(k.kind, changed)); err != nil {
			return fmt.Errorf("kubernetes source: watch %s: %w", k.gvr.Resource, err)
		}
		infs[k.kind] = inf
		synced = append(synced, inf.HasSynced)
	}
	d.mu.Lock()
	d.informers = infs
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		d.informers = nil
		d.mu.Unlock()
	}()

	factory.Start(ctx.Done())
	defer factory.Shutdown() // after cancel: waits for the informers' goroutines

	changed()
	var wg sync.WaitGroup
	wg.Go(func() {
		if cache.WaitForCacheSync(ctx.Done(), synced...) {
			changed()
		}
	})
	wg.Go(func() { d.status.run(ctx) })
	<-ctx.Done()
	wg.Wait()
	return nil
}

// handler signals changed for what can change a declared policy.
func (d *Driver) handler(kind string, changed func()) cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { changed() },
		UpdateFunc: func(oldObj, newObj any) {
			o, ok1 := oldObj.(*unstructured.Unstructured)
			n, ok2 := newObj.(*unstructured.Unstructured)
			if ok2 {
				d.status.observed(objectName(kind, n.GetName()), n)
			}
			if ok1 && ok2 && o.GetGeneration() == n.GetGeneration() && o.GetGeneration() != 0 &&
				o.GetAnnotations()[v1alpha1.AnnotationAdopt] == n.GetAnnotations()[v1alpha1.AnnotationAdopt] {
				return // a status write, or metadata the policy does not hold
			}
			changed()
		},
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if u, ok := obj.(*unstructured.Unstructured); ok {
				d.status.forget(objectName(kind, u.GetName()))
			}
			changed()
		},
	}
}

// cached returns the informer's copy of an object (not to be modified), or
// nil.
func (d *Driver) cached(kind, name string) *unstructured.Unstructured {
	d.mu.Lock()
	inf := d.informers[kind]
	d.mu.Unlock()
	if inf == nil {
		return nil
	}
	obj, ok, err := inf.GetStore().GetByKey(name)
	if err != nil || !ok {
		return nil
	}
	u, _ := obj.(*unstructured.Unstructured)
	return u
}

// Observe reads both kinds from the informers' caches. It is Complete only
// once both have synced, so a partial read never prunes.
func (d *Driver) Observe(ctx context.Context) (*sources.Observation, error) {
	d.mu.Lock()
	infs := d.informers
	d.mu.Unlock()
	obs := &sources.Observation{}
	if infs == nil {
		return obs, nil // not watching: nothing is known
	}
	obs.Complete = true
	var highest uint64
	byName := map[string]string{} // policy name to the object declaring it
	var all []*unstructured.Unstructured
	kindOf := map[*unstructured.Unstructured]string{}
	for _, k := range kinds {
		inf := infs[k.kind]
		if !inf.HasSynced() {
			obs.Complete = false
		}
		if rv, err := strconv.ParseUint(inf.LastSyncResourceVersion(), 10, 64); err == nil {
			highest = max(highest, rv)
		}
		for _, item := range inf.GetStore().List() {
			u, ok := item.(*unstructured.Unstructured)
			if !ok {
				continue
			}
			if rv, err := strconv.ParseUint(u.GetResourceVersion(), 10, 64); err == nil {
				highest = max(highest, rv)
			}
			all = append(all, u)
			kindOf[u] = k.kind
		}
	}
	if highest > 0 {
		obs.Revision = strconv.FormatUint(highest, 10)
	}
	// The oldest object declaring a name keeps it; a ToolPolicy and a
	// ValidatingPolicy of one name would otherwise fight over one policy.
	slices.SortFunc(all, func(a, b *unstructured.Unstructured) int {
		return cmp.Or(a.GetCreationTimestamp().Compare(b.GetCreationTimestamp().Time),
			cmp.Compare(kindOf[a], kindOf[b]), cmp.Compare(a.GetName(), b.GetName()))
	})
	for _, u := range all {
		o, err := fromUnstructured(kindOf[u], u)
		if err == nil {
			if first, dup := byName[o.Name]; dup {
				err = policy.ValidationError{{Field: "metadata.name", Reason: fmt.Sprintf("policy %q is already declared by %s", o.Name, first)}}
			}
		}
		if err != nil {
			obs.Invalid = append(obs.Invalid, objectError(o, err))
			continue
		}
		decl, err := convert(o)
		if err != nil {
			obs.Invalid = append(obs.Invalid, objectError(o, err))
			continue
		}
		byName[o.Name] = decl.Object
		obs.Policies = append(obs.Policies, decl)
	}
	return obs, ctx.Err()
}

// fromUnstructured takes what conversion needs from a cached object.
func fromUnstructured(kind string, u *unstructured.Unstructured) (object, error) {
	o := object{
		Kind:       kind,
		Name:       u.GetName(),
		Generation: u.GetGeneration(),
		Adopt:      u.GetAnnotations()[v1alpha1.AnnotationAdopt] == "true",
	}
	spec, ok := u.Object["spec"]
	if !ok || spec == nil {
		return o, nil // convert says spec: required
	}
	raw, err := json.Marshal(spec)
	if err != nil {
		return o, policy.ValidationError{{Field: "spec", Reason: err.Error()}}
	}
	o.Spec = raw
	return o, nil
}

// Report hands the outcomes of a sync to the status writer, which writes
// them in batches.
func (d *Driver) Report(_ context.Context, outcomes []sources.Outcome) {
	d.status.report(outcomes)
}
