package config

import "reflect"

// ChangedKeys returns the keys whose values differ between a and b, in
// declaration order. A list is one key (raft.peers), and an empty list
// equals a missing one. It is how a reload (SIGHUP) tells which settings an
// edited file changed.
func ChangedKeys(a, b Config) []string {
	var out []string
	for _, l := range schema().leaves() {
		va, vb := fieldOf(&a, l), fieldOf(&b, l)
		if va.Kind() == reflect.Slice && va.Len() == 0 && vb.Len() == 0 {
			continue
		}
		if !reflect.DeepEqual(va.Interface(), vb.Interface()) {
			out = append(out, l.key)
		}
	}
	return out
}
