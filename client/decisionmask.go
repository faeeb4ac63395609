package client

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
)

// DecisionMask says what a decision record leaves out of the request it
// records. Masking happens before a record is kept anywhere, on a copy: the
// caller's Request is never modified. See docs/sidecars.md for the syntax.
type DecisionMask struct {
	// DropHeaders are header names (case-insensitive) removed from the
	// HTTP attributes' headers map (Request.Request["headers"]). They are
	// added to DefaultDropHeaders, which are always dropped unless
	// NoDefaultHeaders is set.
	DropHeaders []string
	// NoDefaultHeaders drops only DropHeaders, without the defaults.
	NoDefaultHeaders bool
	// DropPaths are paths whose values are removed, HashPaths paths whose
	// values are replaced by "sha256:" and the first 16 hex digits of the
	// SHA-256 of the value (a string's bytes, any other value's JSON). A
	// path starts at "input" (the tool call's input) or "request" (the
	// HTTP attributes), then names map keys separated by dots; "*" is
	// every key of a map and "[*]" follows a key for every element of a
	// list: input.password, request.headers.x-token, input.items[*].secret.
	// Keys are matched exactly, except under request.headers, where they
	// are matched case-insensitively. A path that names nothing in a
	// request does nothing. Drops apply before hashes.
	DropPaths []string
	HashPaths []string
}

// DefaultDropHeaders returns the headers a decision record always drops
// (unless DecisionMask.NoDefaultHeaders): authorization, cookie,
// set-cookie, proxy-authorization and x-api-key.
func DefaultDropHeaders() []string {
	return []string{"authorization", "cookie", "set-cookie", "proxy-authorization", "x-api-key"}
}

// maxMaskDepth bounds how deeply nested a recorded value may be; a deeper
// one (or a cycle) fails masking, and its record is dropped and counted.
const maxMaskDepth = 100

// errMaskDepth is the masking failure of a value nested too deeply.
var errMaskDepth = fmt.Errorf("value nested deeper than %d levels", maxMaskDepth)

// errNotFinite is the masking failure of a NaN or an infinity, which JSON
// cannot hold.
var errNotFinite = errors.New("a number that is not finite")

// maskPath is one parsed DropPaths or HashPaths entry.
type maskPath struct {
	root string    // "input" or "request"
	segs []maskSeg // after the root
}

// maskSeg is one step of a path: a map key (or every key), then, with
// each, every element of a list.
type maskSeg struct {
	key  string // "*": every key
	each bool   // [*]: every element of the list under key
}

// masker is a compiled DecisionMask.
type masker struct {
	headers map[string]bool // lowercased names to drop
	drop    []maskPath
	hash    []maskPath
}

func newMasker(m DecisionMask) (*masker, error) {
	mk := &masker{headers: map[string]bool{}}
	if !m.NoDefaultHeaders {
		for _, h := range DefaultDropHeaders() {
			mk.headers[h] = true
		}
	}
	var errs []error
	for i, h := range m.DropHeaders {
		h = strings.ToLower(strings.TrimSpace(h))
		if h == "" {
			errs = append(errs, fmt.Errorf("drop headers[%d]: empty name", i))
			continue
		}
		mk.headers[h] = true
	}
	for _, l := range []struct {
		name  string
		paths []string
		out   *[]maskPath
	}{{"drop paths", m.DropPaths, &mk.drop}, {"hash paths", m.HashPaths, &mk.hash}} {
		for i, s := range l.paths {
			p, err := parseMaskPath(s)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s[%d]: %w", l.name, i, err))
				continue
			}
			*l.out = append(*l.out, p)
		}
	}
	return mk, errors.Join(errs...)
}

// parseMaskPath parses "root(.key([*])?)*".
func parseMaskPath(s string) (maskPath, error) {
	parts := strings.Split(s, ".")
	p := maskPath{root: parts[0]}
	if p.root != "input" && p.root != "request" {
		return p, fmt.Errorf("%q: a path starts with input or request", s)
	}
	if len(parts) == 1 {
		return p, fmt.Errorf("%q: a path names at least one key after its root", s)
	}
	for _, part := range parts[1:] {
		seg := maskSeg{key: part}
		if k, ok := strings.CutSuffix(part, "[*]"); ok {
			seg = maskSeg{key: k, each: true}
		}
		if seg.key == "" || strings.ContainsAny(seg.key, "[]") {
			return p, fmt.Errorf("%q: bad segment %q (want a key, * or key[*])", s, part)
		}
		p.segs = append(p.segs, seg)
	}
	return p, nil
}

// mask returns a masked deep copy of the request's tool input and HTTP
// attributes, and whether masking changed anything. An error (a value
// nested too deeply or that cannot be encoded) fails the record.
func (mk *masker) mask(req *Request) (input, http map[string]any, changed bool, err error) {
	if req.Input != nil {
		if input, err = copyMap(req.Input, 0); err != nil {
			return nil, nil, false, fmt.Errorf("input: %w", err)
		}
	}
	if req.Request != nil {
		if http, err = copyMap(req.Request, 0); err != nil {
			return nil, nil, false, fmt.Errorf("request: %w", err)
		}
		if h, ok := http["headers"].(map[string]any); ok && len(mk.headers) > 0 {
			for k := range h {
				if mk.headers[strings.ToLower(k)] {
					delete(h, k)
					changed = true
				}
			}
		}
	}
	for _, p := range mk.drop {
		changed = applyPath(rootOf(p.root, input, http), p, 0, false, nil) || changed
	}
	for _, p := range mk.hash {
		changed = applyPath(rootOf(p.root, input, http), p, 0, false, hashValue) || changed
	}
	return input, http, changed, nil
}

func rootOf(root string, input, http map[string]any) map[string]any {
	if root == "input" {
		return input
	}
	return http
}

// applyPath drops (f nil) or replaces by f(value) what p's segments from
// i on name in m, and reports whether it found anything. fold matches keys
// case-insensitively (under request.headers).
func applyPath(m map[string]any, p maskPath, i int, fold bool, f func(any) any) bool {
	if m == nil {
		return false
	}
	seg := p.segs[i]
	fold = fold || (p.root == "request" && i == 1 && p.segs[0].key == "headers" && !p.segs[0].each)
	found := false
	for k, v := range m {
		if !keyMatches(seg.key, k, fold) {
			continue
		}
		last := i == len(p.segs)-1
		if !seg.each {
			switch {
			case !last:
				sub, _ := v.(map[string]any)
				found = applyPath(sub, p, i+1, fold, f) || found
			case f == nil:
				delete(m, k)
				found = true
			default:
				m[k] = f(v)
				found = true
			}
			continue
		}
		list, ok := v.([]any)
		if !ok {
			continue
		}
		switch {
		case !last:
			for _, e := range list {
				sub, _ := e.(map[string]any)
				found = applyPath(sub, p, i+1, fold, f) || found
			}
		case f == nil:
			if len(list) > 0 {
				m[k] = []any{}
				found = true
			}
		default:
			for j, e := range list {
				list[j] = f(e)
			}
			found = found || len(list) > 0
		}
	}
	return found
}

// keyMatches reports whether a path segment's key names map key k.
func keyMatches(seg, k string, fold bool) bool {
	return seg == "*" || k == seg || (fold && strings.EqualFold(k, seg))
}

// hashValue is what a hashed value becomes.
func hashValue(v any) any {
	var b []byte
	if s, ok := v.(string); ok {
		b = []byte(s)
	} else {
		b, _ = json.Marshal(v) // a copy made by copyValue: it encodes
	}
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:8])
}

// copyMap deep-copies m into values encoding/json writes: maps of
// string to any, []any and scalars.
func copyMap(m map[string]any, depth int) (map[string]any, error) {
	if depth >= maxMaskDepth {
		return nil, errMaskDepth
	}
	out := make(map[string]any, len(m))
	for k, v := range m {
		c, err := copyValue(v, depth+1)
		if err != nil {
			return nil, err
		}
		out[k] = c
	}
	return out, nil
}

// copyValue deep-copies v (see copyMap). The usual types of decoded JSON
// and HTTP headers are copied directly; anything else goes through its
// JSON encoding, whose failure (a NaN, a channel, a cycle) fails masking.
func copyValue(v any, depth int) (any, error) {
	if depth >= maxMaskDepth {
		return nil, errMaskDepth
	}
	switch v := v.(type) {
	case nil, string, bool, int, int64, int32, uint, uint64, uint32, json.Number:
		return v, nil
	case float64:
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return nil, errNotFinite
		}
		return v, nil
	case map[string]any:
		return copyMap(v, depth)
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			c, err := copyValue(e, depth+1)
			if err != nil {
				return nil, err
			}
			out[i] = c
		}
		return out, nil
	case map[string]string:
		out := make(map[string]any, len(v))
		for k, s := range v {
			out[k] = s
		}
		return out, nil
	case []string:
		out := make([]any, len(v))
		for i, s := range v {
			out[i] = s
		}
		return out, nil
	case map[string][]string: // http.Header
		out := make(map[string]any, len(v))
		for k, l := range v {
			c, err := copyValue(l, depth+1)
			if err != nil {
				return nil, err
			}
			out[k] = c
		}
		return out, nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var out any
	if err := d.Decode(&out); err != nil {
		return nil, err
	}
	return out, nil
}
