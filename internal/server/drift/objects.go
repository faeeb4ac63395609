package drift

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/cache"

	"github.com/policyd/policyd/internal/drift/admission"
)

// ErrClosed is returned by Objects after Close.
var ErrClosed = errors.New("drift objects closed")

var namespaceGVR = schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}

// Objects implements admission.Objects over informers.
type Objects struct {
	logger *slog.Logger
	dyn    dynamic.Interface
	mapper *restmapper.DeferredDiscoveryRESTMapper

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu        sync.Mutex
	closed    bool
	informers map[schema.GroupVersionKind]*kindInformer
	ns        *kindInformer
	// rediscovered is when discovery was last refreshed for an unknown kind.
	rediscovered time.Time
}

// kindInformer is one resource's informer.
type kindInformer struct {
	gvr        schema.GroupVersionResource
	namespaced bool
	informer   cache.SharedIndexInformer
}

var _ admission.Objects = (*Objects)(nil)

// NewObjects builds Objects over a dynamic client and discovery. It starts
// the namespace informer at once; parent informers start as kinds are seen.
// Call Close to stop them.
func NewObjects(logger *slog.Logger, dyn dynamic.Interface, disco discovery.DiscoveryInterface) *Objects {
	ctx, cancel := context.WithCancel(context.Background())
	o := &Objects{
		logger:    logger,
		dyn:       dyn,
		mapper:    restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disco)),
		ctx:       ctx,
		cancel:    cancel,
		informers: map[schema.GroupVersionKind]*kindInformer{},
	}
	o.ns = o.start(namespaceGVR, false)
	return o
}

// Mapper is the discovery-backed RESTMapper, shared with the follow-up.
func (o *Objects) Mapper() meta.RESTMapper { return o.mapper }

// Close stops every informer and waits for them.
func (o *Objects) Close() {
	o.mu.Lock()
	o.closed = true
	o.mu.Unlock()
	o.cancel()
	o.wg.Wait()
}

// start runs an informer for gvr until Close. Callers hold mu, or own o.
func (o *Objects) start(gvr schema.GroupVersionResource, namespaced bool) *kindInformer {
	inf := dynamicinformer.NewFilteredDynamicInformer(o.dyn, gvr, metav1.NamespaceAll, 0, cache.Indexers{}, nil).Informer()
	// managedFields are most of an object's size and nothing reads them.
	_ = inf.SetTransform(func(obj any) (any, error) {
		if u, ok := obj.(*unstructured.Unstructured); ok {
			u.SetManagedFields(nil)
		}
		return obj, nil
	})
	o.wg.Add(1)
	go func() {
		defer o.wg.Done()
		inf.Run(o.ctx.Done())
	}()
	o.logger.Info("started informer", "resource", gvr.String())
	return &kindInformer{gvr: gvr, namespaced: namespaced, informer: inf}
}

// informerFor returns the informer of gvk, starting it on first use.
func (o *Objects) informerFor(gvk schema.GroupVersionKind) (*kindInformer, error) {
	o.mu.Lock()
	ki, ok := o.informers[gvk]
	closed := o.closed
	o.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	if ok {
		return ki, nil
	}
	// Discovery is outside the lock: it is an API call the first time.
	mapping, err := o.restMapping(gvk)
	if err != nil {
		return nil, err
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return nil, ErrClosed
	}
	if ki, ok := o.informers[gvk]; ok {
		return ki, nil
	}
	ki = o.start(mapping.Resource, mapping.Scope.Name() == meta.RESTScopeNameNamespace)
	o.informers[gvk] = ki
	return ki, nil
}

// restMapping maps gvk, refreshing discovery once for a kind it does not
// know (a CRD installed since).
func (o *Objects) restMapping(gvk schema.GroupVersionKind) (*meta.RESTMapping, error) {
	m, err := o.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if meta.IsNoMatchError(err) && o.mayRediscover() {
		o.mapper.Reset()
		m, err = o.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	}
	if err != nil {
		return nil, fmt.Errorf("map %s: %w", gvk, err)
	}
	return m, nil
}

// rediscoverEvery bounds discovery refreshes: an owner reference naming a
// kind that does not exist must not cost a discovery round per request.
const rediscoverEvery = 30 * time.Second

func (o *Objects) mayRediscover() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if time.Since(o.rediscovered) < rediscoverEvery {
		return false
	}
	o.rediscovered = time.Now()
	return true
}

var _ admission.FreshObjects = (*Objects)(nil)

// Parent implements admission.Objects. A cached object whose UID differs
// from the reference's is read again: the cache may trail a re-creation.
func (o *Objects) Parent(ctx context.Context, namespace string, ref metav1.OwnerReference) (*unstructured.Unstructured, error) {
	return o.parent(ctx, namespace, ref, false)
}

// FreshParent implements admission.FreshObjects: Parent read from the API
// server, for the rare decisions that must not rest on a cache that may
// trail it.
func (o *Objects) FreshParent(ctx context.Context, namespace string, ref metav1.OwnerReference) (*unstructured.Unstructured, error) {
	return o.parent(ctx, namespace, ref, true)
}

func (o *Objects) parent(ctx context.Context, namespace string, ref metav1.OwnerReference, fresh bool) (*unstructured.Unstructured, error) {
	gv, err := schema.ParseGroupVersion(ref.APIVersion)
	if err != nil {
		return nil, fmt.Errorf("owner reference apiVersion %q: %w", ref.APIVersion, err)
	}
	ki, err := o.informerFor(gv.WithKind(ref.Kind))
	if err != nil {
		return nil, err
	}
	if !ki.namespaced {
		namespace = ""
	}
	u, err := o.get(ctx, ki, namespace, ref.Name, func(u *unstructured.Unstructured) bool {
		return !fresh && (ref.UID == "" || u.GetUID() == ref.UID)
	})
	if err != nil || u == nil {
		return u, err
	}
	if ref.UID != "" && u.GetUID() != ref.UID {
		return nil, nil // the owner is gone; a namesake replaced it
	}
	return u, nil
}

// Namespace implements admission.Objects.
func (o *Objects) Namespace(ctx context.Context, name string) (*unstructured.Unstructured, error) {
	if name == "" {
		return nil, nil
	}
	return o.get(ctx, o.ns, "", name, func(*unstructured.Unstructured) bool { return true })
}

// get reads from the cache, falling back to a GET when the cache has no
// acceptable copy. The result is a copy the caller may keep.
func (o *Objects) get(ctx context.Context, ki *kindInformer, namespace, name string, ok func(*unstructured.Unstructured) bool) (*unstructured.Unstructured, error) {
	if u := cached(ki, namespace, name); u != nil && ok(u) {
		return u.DeepCopy(), nil
	}
	var r dynamic.ResourceInterface = o.dyn.Resource(ki.gvr)
	if ki.namespaced {
		r = o.dyn.Resource(ki.gvr).Namespace(namespace)
	}
	u, err := r.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get %s %s/%s: %w", ki.gvr.Resource, namespace, name, err)
	}
	u.SetManagedFields(nil)
	return u, nil
}

func cached(ki *kindInformer, namespace, name string) *unstructured.Unstructured {
	if !ki.informer.HasSynced() {
		return nil
	}
	key := name
	if namespace != "" {
		key = namespace + "/" + name
	}
	item, exists, err := ki.informer.GetIndexer().GetByKey(key)
	if err != nil || !exists {
		return nil
	}
	u, _ := item.(*unstructured.Unstructured)
	return u
}

// Cached returns the informer's copy of an object, if a synced informer for
// its kind runs and holds it (nil otherwise). Tests wait on it for the
// cache to catch up with a write before they depend on it.
func (o *Objects) Cached(gvk schema.GroupVersionKind, namespace, name string) *unstructured.Unstructured {
	o.mu.Lock()
	ki := o.informers[gvk]
	if gvk == (schema.GroupVersionKind{Version: "v1", Kind: "Namespace"}) {
		ki = o.ns
	}
	o.mu.Unlock()
	if ki == nil {
		return nil
	}
	if u := cached(ki, namespace, name); u != nil {
		return u.DeepCopy()
	}
	return nil
}
