package admission

import (
	"maps"
	"slices"
)

// The three annotation compute functions, plus CREATE. Each returns the
// object's complete new annotation map, except the trace: where it is
// recomputed (a CREATE, a spec change) the caller sets it, since its last
// hop takes its labels from the map. "System" annotations are trace,
// updaters, controllers and phase; "user" annotations are every other key
// under the prefix.

// computeAnnotationsForController handles a controller's CREATE-less write
// to a child: the controller copies its parent's annotations onto the
// child, so every user annotation comes from the old object, and the system
// ones too unless the spec changed, in which case trace and updaters are
// recomputed (controllers and phase, which belong to the child's role as a
// parent, are always kept).
func (c Config) computeAnnotationsForController(oldAnn, newAnn map[string]string, specChanged bool, updaters []string) map[string]string {
	out := c.without(newAnn, func(string) bool { return true })
	c.copyOurs(out, oldAnn, func(string) bool { return true })
	if specChanged {
		out[c.key(annUpdaters)] = FormatHashes(updaters)
	}
	return out
}

// computeAnnotationsForUser handles anyone else's write: user annotations
// are the user's to change, except that a change to exactly the parent's
// value is taken for a controller's copy and undone (a controller can act
// as a "user" while identification is lenient); system annotations are kept
// from the old object and, on a spec change, trace starts a new origin and
// the user joins the updaters. Two monotonic changes of system annotations
// pass, so that the leader's own patches survive this webhook: appending
// one hash to controllers, and raising phase to initialized.
func (c Config) computeAnnotationsForUser(oldAnn, newAnn, parentAnn map[string]string, specChanged bool, updaters []string) map[string]string {
	out := c.without(newAnn, c.system)
	c.copyOurs(out, oldAnn, c.system)
	for k, v := range newAnn {
		if pv, ok := parentAnn[k]; !c.ours(k) || c.system(k) || !ok || pv != v || oldAnn[k] == v {
			continue
		}
		if ov, ok := oldAnn[k]; ok {
			out[k] = ov
		} else {
			delete(out, k)
		}
	}
	if v, ok := newAnn[c.key(annControllers)]; ok && isOneHashAppend(oldAnn[c.key(annControllers)], v) {
		out[c.key(annControllers)] = v
	}
	if newAnn[c.key(annPhase)] == PhaseInitialized {
		out[c.key(annPhase)] = PhaseInitialized
	}
	if specChanged {
		out[c.key(annUpdaters)] = FormatHashes(updaters)
	}
	return out
}

// computeAnnotationsForStatusUpdate handles a status subresource update: it
// keeps every annotation under the prefix from the old object and adds the
// requester to controllers.
func (c Config) computeAnnotationsForStatusUpdate(oldAnn, newAnn map[string]string, hash string) map[string]string {
	out := c.without(newAnn, func(string) bool { return true })
	c.copyOurs(out, oldAnn, func(string) bool { return true })
	out[c.key(annControllers)] = FormatHashes(AddHash(ParseHashes(oldAnn[c.key(annControllers)]), hash))
	return out
}

// computeAnnotationsForCreate wipes what a controller copied from the parent
// and computes fresh values: every system annotation goes, and a user
// annotation goes when the creator is the controller or its value equals the
// parent's (a copy); a user's own approvals or freeze on a new object stay.
func (c Config) computeAnnotationsForCreate(newAnn, parentAnn map[string]string, controller bool, updaters []string) map[string]string {
	out := c.without(newAnn, func(k string) bool {
		if c.system(k) || controller {
			return true
		}
		pv, ok := parentAnn[k]
		return ok && pv == newAnn[k]
	})
	out[c.key(annUpdaters)] = FormatHashes(updaters)
	return out
}

// without copies ann, leaving out our keys for which drop is true.
func (c Config) without(ann map[string]string, drop func(string) bool) map[string]string {
	out := make(map[string]string, len(ann)+2)
	for k, v := range ann {
		if c.ours(k) && drop(k) {
			continue
		}
		out[k] = v
	}
	return out
}

// copyOurs copies our keys selected by pick from src into dst.
func (c Config) copyOurs(dst, src map[string]string, pick func(string) bool) {
	for k, v := range src {
		if c.ours(k) && pick(k) {
			dst[k] = v
		}
	}
}

// isOneHashAppend reports whether next is prev with exactly one new hash
// added the way AddHash adds it.
func isOneHashAppend(prev, next string) bool {
	p, n := ParseHashes(prev), ParseHashes(next)
	if len(n) == 0 || FormatHashes(n) != next {
		return false
	}
	h := n[len(n)-1]
	return !slices.Contains(p, h) && slices.Equal(AddHash(p, h), n)
}

// sameAnnotations reports whether two annotation maps are equal, treating
// nil and empty alike.
func sameAnnotations(a, b map[string]string) bool { return maps.Equal(a, b) }
