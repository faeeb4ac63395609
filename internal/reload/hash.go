package reload

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash"
	"slices"

	corev1 "k8s.io/api/core/v1"
)

// DataHash is the lowercase hex SHA-256 of a ConfigMap's data and
// binaryData: what a restart rolls out and what the cache compares. Keys are
// fed in sorted order, every string length-prefixed, so no two different
// ConfigMaps share a hash by concatenation. Labels, annotations and other
// metadata are left out: editing them is not a change.
func DataHash(cm *corev1.ConfigMap) string {
	h := sha256.New()
	writeMap(h, 'd', cm.Data)
	bin := make(map[string]string, len(cm.BinaryData))
	for k, v := range cm.BinaryData {
		bin[k] = string(v)
	}
	writeMap(h, 'b', bin)
	return hex.EncodeToString(h.Sum(nil))
}

func writeMap(h hash.Hash, tag byte, m map[string]string) {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	h.Write([]byte{tag})
	writeLen(h, len(keys))
	for _, k := range keys {
		writeLen(h, len(k))
		h.Write([]byte(k))
		writeLen(h, len(m[k]))
		h.Write([]byte(m[k]))
	}
}

func writeLen(h hash.Hash, n int) {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(n))
	h.Write(b[:])
}

// maxAnnotationName is the longest name part of a qualified annotation key
// (the part after "<prefix>/").
const maxAnnotationName = 63

// HashAnnotation is the pod-template annotation <prefix>/config-hash-<cm>
// that records which data of ConfigMap cm the pods were started with. A
// ConfigMap name may be up to 253 characters but an annotation name only
// 63, so a long name is cut and suffixed with a hash of the full name, which
// keeps the key unique and stable.
func HashAnnotation(prefix, cm string) string {
	name := "config-hash-" + cm
	if len(name) > maxAnnotationName {
		sum := sha256.Sum256([]byte(cm))
		suffix := "-" + hex.EncodeToString(sum[:])[:10]
		name = name[:maxAnnotationName-len(suffix)] + suffix
	}
	return prefix + "/" + name
}

// RestartedAtAnnotation is the pod-template annotation <prefix>/restartedAt
// (RFC 3339), the same mechanism as kubectl rollout restart. Alone, without
// a hash annotation, it marks a Deployment restarted by a version that did
// not record hashes (the legacy form startup reconciliation repairs).
func RestartedAtAnnotation(prefix string) string { return prefix + "/restartedAt" }

// startupAction is what startup reconciliation does about one Deployment
// and one ConfigMap of its scope.
type startupAction int

const (
	// inSync: the Deployment's hash annotation matches the ConfigMap.
	inSync startupAction = iota
	// drifted: the hash annotation names other data; the ConfigMap changed
	// while no controller was watching.
	drifted
	// legacyRepair: only the restart annotation exists; one restart
	// records the hash.
	legacyRepair
	// baselineUnknown: neither annotation exists, so nothing tells whether
	// the pods run the current data; the Deployment is left alone.
	baselineUnknown
)

func (a startupAction) String() string {
	return [...]string{"in-sync", "startup-drift", "legacy-repair", "baseline-unknown"}[a]
}

// reconcileAction decides startup reconciliation for a pod template's
// annotations against the ConfigMap cm's current data hash.
func reconcileAction(annotations map[string]string, prefix, cm, dataHash string) startupAction {
	if got, ok := annotations[HashAnnotation(prefix, cm)]; ok {
		if got == dataHash {
			return inSync
		}
		return drifted
	}
	if _, ok := annotations[RestartedAtAnnotation(prefix)]; ok {
		return legacyRepair
	}
	return baselineUnknown
}
