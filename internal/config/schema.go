package config

import (
	"fmt"
	"reflect"
	"sort"
	"strings"
	"sync"
	"time"
)

// node is one key of the configuration schema, derived from Config's
// mapstructure tags so that a field added to the struct is a known key (with
// an environment variable) without any list to update.
type node struct {
	key   string       // dotted key from the root ("raft.peers"); relative inside a list element ("id")
	typ   reflect.Type // the field's type
	index []int        // field index path from the enclosing struct (Config, or the list element)

	// fields is set for struct nodes: the children by tag, in declaration order.
	fields []*node
	// elem is set for lists of structs: the element's struct node.
	elem *node
}

var durationType = reflect.TypeFor[time.Duration]()

// schema is built once: Config's shape cannot change at run time.
var schema = sync.OnceValue(func() *node {
	return buildNode("", reflect.TypeFor[Config](), nil)
})

func buildNode(key string, t reflect.Type, index []int) *node {
	n := &node{key: key, typ: t, index: index}
	switch {
	case t.Kind() == reflect.Struct:
		for i := range t.NumField() {
			f := t.Field(i)
			if !f.IsExported() {
				continue
			}
			name, _, _ := strings.Cut(f.Tag.Get("mapstructure"), ",")
			if name == "-" {
				continue
			}
			if name == "" {
				// A silent fallback to the field name would make a key
				// that nobody chose; every key is part of the contract.
				panic(fmt.Sprintf("config: field %s.%s has no mapstructure tag", t.Name(), f.Name))
			}
			childIndex := append(append([]int(nil), index...), i)
			n.fields = append(n.fields, buildNode(joinKey(key, name), f.Type, childIndex))
		}
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Struct:
		// Element keys are relative so that they can be decoded and checked
		// the same way for every entry.
		n.elem = buildNode("", t.Elem(), nil)
	}
	return n
}

func joinKey(prefix, name string) string {
	if prefix == "" {
		return name
	}
	return prefix + "." + name
}

// isStruct reports whether n is a mapping of further keys (not a value).
func (n *node) isStruct() bool { return n.fields != nil }

// child returns the field named name (case-insensitively, as viper folds
// keys) or nil.
func (n *node) child(name string) *node {
	for _, f := range n.fields {
		if strings.EqualFold(lastSegment(f.key), name) {
			return f
		}
	}
	return nil
}

// leaves returns every value-holding node under n, in declaration order.
// A list of structs is one leaf: it is set as a whole.
func (n *node) leaves() []*node {
	if !n.isStruct() {
		return []*node{n}
	}
	var out []*node
	for _, f := range n.fields {
		out = append(out, f.leaves()...)
	}
	return out
}

func lastSegment(key string) string {
	if i := strings.LastIndexByte(key, '.'); i >= 0 {
		return key[i+1:]
	}
	return key
}

// knownKeys returns every dotted key of Config that holds a value, sorted.
func knownKeys() []string {
	var keys []string
	for _, l := range schema().leaves() {
		keys = append(keys, l.key)
	}
	sort.Strings(keys)
	return keys
}

// envName is the environment variable for key: POLICYD_ plus the key
// upper-cased with dots as underscores.
func envName(key string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
}

const envPrefix = "POLICYD_"

// suggest returns a known key close to the unknown one, or "". Siblings are
// tried first (a typo), then keys anywhere with the same last segment (a key
// put under the wrong section).
func suggest(parent *node, name, parentPath string) string {
	best, bestDist := "", 3
	for _, f := range parent.fields {
		cand := lastSegment(f.key)
		if d := editDistance(strings.ToLower(name), cand); d < bestDist && d < len(cand)/2+1 {
			best, bestDist = cand, d
		}
	}
	if best != "" {
		return joinPath(parentPath, best)
	}
	for _, k := range knownKeys() {
		if lastSegment(k) == strings.ToLower(name) {
			return k
		}
	}
	return ""
}

// joinPath joins a display path ("raft.peers[1]") and a key segment.
func joinPath(prefix, name string) string {
	if prefix == "" {
		return name
	}
	return prefix + "." + name
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
