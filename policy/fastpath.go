package policy

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"slices"
	"strings"
)

// The write path decodes every policy on the node that takes the request
// (DecodePolicy), canonicalises its spec (Canonical), and stores and reads it
// back on every replica (DecodeStored). encoding/json makes several passes
// over a 4 KB policy for each of those, and together they were most of the
// CPU a write costs. The fast paths here handle the common shape in one pass
// and give up (ok false) on anything else, and the caller then takes the
// encoding/json path; so each fast path must give exactly what the slow one
// gives whenever it does not give up. The fuzz tests compare them.

// plainString reads the JSON string at b[i] if it is printable ASCII with no
// escapes, whose Go value is its bytes and which json.Marshal writes back
// unchanged unless it holds '<', '>' or '&' (see plainForMarshal).
func plainString(b []byte, i int) (s string, end int, ok bool) {
	if i >= len(b) || b[i] != '"' {
		return "", 0, false
	}
	q := bytes.IndexByte(b[i+1:], '"')
	if q < 0 || !plainRun(b[i+1:i+1+q], false) {
		return "", 0, false
	}
	return string(b[i+1 : i+1+q]), i + q + 2, true
}

// plainForMarshal reports whether json.Marshal writes s as '"' + s + '"'.
// s is printable ASCII (from plainString); json.Marshal escapes only the
// HTML-sensitive characters among those.
func plainForMarshal(s []byte) bool {
	return plainRun(s, true)
}

const ones, highs = 0x0101010101010101, 0x8080808080808080

// hasZero reports whether a byte of x is zero (exact as a boolean).
func hasZero(x uint64) bool { return (x-ones)&^x&highs != 0 }

// plainRun reports whether s is printable ASCII (0x20 to 0x7e) without a
// backslash, and with html also without '<', '>' and '&'. Policies are
// mostly long strings, so it tests eight bytes at a time.
func plainRun(s []byte, html bool) bool {
	for len(s) >= 8 {
		x := binary.LittleEndian.Uint64(s)
		if x&highs != 0 || // 0x80 and above
			(x-ones*0x20)&^x&highs != 0 || // below 0x20
			hasZero(x^(ones*0x7f)) || hasZero(x^(ones*'\\')) ||
			(html && (hasZero(x^(ones*'<')) || hasZero(x^(ones*'>')) || hasZero(x^(ones*'&')))) {
			return false
		}
		s = s[8:]
	}
	for _, c := range s {
		if c < 0x20 || c >= 0x7f || c == '\\' || (html && (c == '<' || c == '>' || c == '&')) {
			return false
		}
	}
	return true
}

// validJSON is json.Valid, in one fast pass for what validValueEnd takes.
func validJSON(b []byte) bool {
	if end, ok := validValueEnd(b, skipSpace(b, 0)); ok && skipSpace(b, end) == len(b) {
		return true
	}
	return json.Valid(b)
}

// decodePolicyFast decodes a request body that is an object of name, kind,
// scope, labels and spec, each at most once and in any order, with plain
// strings (see plainString), as DecodeStrict would. It gives up on anything
// else, the cluster-managed fields included, so that DecodeStrict reports
// every problem in its own words.
func decodePolicyFast(data []byte) (*Policy, bool) {
	var p Policy
	var seen struct{ name, kind, scope, labels, spec bool }
	once := func(f *bool) bool {
		first := !*f
		*f = true
		return first
	}
	end, ok := members(data, skipSpace(data, 0), func(key string, i int) (int, bool) {
		ok := false
		switch key {
		case "name":
			if once(&seen.name) {
				p.Name, i, ok = plainString(data, i)
			}
		case "kind":
			if once(&seen.kind) {
				p.Kind, i, ok = plainString(data, i)
			}
		case "scope":
			if once(&seen.scope) {
				i, ok = decodeScopeFast(data, i, &p.Scope)
			}
		case "labels":
			if once(&seen.labels) {
				p.Labels, i, ok = decodeLabelsFast(data, i)
			}
		case "spec":
			if once(&seen.spec) {
				var end int
				if end, ok = validValueEnd(data, i); ok {
					p.Spec, i = bytes.Clone(data[i:end]), end
				}
			}
		}
		return i, ok
	})
	if !ok || skipSpace(data, end) != len(data) {
		return nil, false
	}
	return &p, true
}

func decodeScopeFast(data []byte, i int, s *Scope) (int, bool) {
	var seen [3]bool
	return members(data, i, func(key string, i int) (int, bool) {
		var dst *string
		var n int
		switch key {
		case "org":
			dst, n = &s.Org, 0
		case "team":
			dst, n = &s.Team, 1
		case "employee":
			dst, n = &s.Employee, 2
		default:
			return 0, false
		}
		if seen[n] {
			return 0, false
		}
		seen[n] = true
		var ok bool
		*dst, i, ok = plainString(data, i)
		return i, ok
	})
}

func decodeLabelsFast(data []byte, i int) (map[string]string, int, bool) {
	labels := map[string]string{}
	end, ok := members(data, i, func(key string, i int) (int, bool) {
		if _, dup := labels[key]; dup {
			return 0, false
		}
		v, i, ok := plainString(data, i)
		labels[key] = v
		return i, ok
	})
	if !ok {
		return nil, 0, false
	}
	return labels, end, true
}

// members walks the object at b[i]. For each member whose key is a plain
// string (see plainString) it calls member with the key and the index of
// the value, and member returns where the value ends. It returns the index
// after the closing brace, or false when the object is not in that shape or
// member gives up. Duplicate keys are member's to refuse.
func members(b []byte, i int, member func(key string, i int) (int, bool)) (int, bool) {
	i, ok := objectStart(b, i)
	if !ok {
		return 0, false
	}
	for first := true; ; first = false {
		var more bool
		if i, more, ok = objectNext(b, i, first); !ok {
			return 0, false
		}
		if !more {
			return i, true
		}
		key, j, ok := plainString(b, i)
		if !ok {
			return 0, false
		}
		if i, ok = colon(b, j); !ok {
			return 0, false
		}
		if i, ok = member(key, i); !ok {
			return 0, false
		}
	}
}

// objectStart consumes '{' and the space after it.
func objectStart(b []byte, i int) (int, bool) {
	if i >= len(b) || b[i] != '{' {
		return 0, false
	}
	return skipSpace(b, i+1), true
}

// objectNext is called before each member: it consumes the ',' before every
// member but the first, or the closing '}' (more false), and the space
// around them.
func objectNext(b []byte, i int, first bool) (next int, more, ok bool) {
	i = skipSpace(b, i)
	if i >= len(b) {
		return 0, false, false
	}
	if b[i] == '}' {
		return i + 1, false, true
	}
	if !first {
		if b[i] != ',' {
			return 0, false, false
		}
		i = skipSpace(b, i+1)
	}
	return i, true, true
}

// colon consumes the space, ':' and space after an object key.
func colon(b []byte, i int) (int, bool) {
	i = skipSpace(b, i)
	if i >= len(b) || b[i] != ':' {
		return 0, false
	}
	return skipSpace(b, i+1), true
}

// appendCanonicalFast appends the canonical form of the one JSON value in
// raw (space around it allowed): what canonicalJSON gives, that is
// json.Marshal of the value decoded with UseNumber, for values whose strings
// are all plain (see plainString and plainForMarshal) and whose objects have
// no duplicate keys. Numbers and literals are copied as written, which is
// what json.Marshal does with a json.Number.
func appendCanonicalFast(dst, raw []byte) ([]byte, bool) {
	dst, i, ok := appendCanonicalValue(dst, raw, skipSpace(raw, 0), 0)
	if !ok || skipSpace(raw, i) != len(raw) {
		return nil, false
	}
	return dst, true
}

type canonicalMember struct {
	key   string
	value []byte
}

func appendCanonicalValue(dst, b []byte, i, depth int) ([]byte, int, bool) {
	if i >= len(b) || depth >= maxFastDepth {
		return nil, 0, false
	}
	switch b[i] {
	case '{':
		var ms []canonicalMember
		i, ok := members(b, i, func(key string, i int) (int, bool) {
			if !plainForMarshal([]byte(key)) {
				return 0, false
			}
			v, i, ok := appendCanonicalValue(nil, b, i, depth+1)
			ms = append(ms, canonicalMember{key, v})
			return i, ok
		})
		if !ok {
			return nil, 0, false
		}
		slices.SortFunc(ms, func(x, y canonicalMember) int { return strings.Compare(x.key, y.key) })
		dst = append(dst, '{')
		for k, m := range ms {
			if k > 0 {
				if ms[k-1].key == m.key {
					// Decoding keeps the last duplicate; leave that to it.
					return nil, 0, false
				}
				dst = append(dst, ',')
			}
			dst = append(dst, '"')
			dst = append(dst, m.key...)
			dst = append(dst, `":`...)
			dst = append(dst, m.value...)
		}
		return append(dst, '}'), i, true
	case '[':
		dst = append(dst, '[')
		first := true
		i, ok := elements(b, i, func(i int) (int, bool) {
			if !first {
				dst = append(dst, ',')
			}
			first = false
			var ok bool
			dst, i, ok = appendCanonicalValue(dst, b, i, depth+1)
			return i, ok
		})
		if !ok {
			return nil, 0, false
		}
		return append(dst, ']'), i, true
	case '"':
		_, end, ok := plainString(b, i)
		if !ok || !plainForMarshal(b[i+1:end-1]) {
			return nil, 0, false
		}
		return append(dst, b[i:end]...), end, true
	default:
		// A number or literal; validValueEnd checks its syntax.
		end, ok := validValueEnd(b, i)
		if !ok {
			return nil, 0, false
		}
		return append(dst, b[i:end]...), end, true
	}
}

// jsonString reads the JSON string at b[i]. A plain one (see plainString) is
// its bytes; any other is unquoted by encoding/json, so escapes and invalid
// UTF-8 come out exactly as json.Unmarshal has them.
func jsonString(b []byte, i int) (s string, end int, ok bool) {
	if s, end, ok = plainString(b, i); ok {
		return s, end, true
	}
	if i >= len(b) || b[i] != '"' {
		return "", 0, false
	}
	if end, ok = stringEnd(b, i); !ok {
		return "", 0, false
	}
	if json.Unmarshal(b[i:end], &s) != nil {
		return "", 0, false
	}
	return s, end, true
}

// decodeToolSpecFast decodes a ToolPolicy spec as DecodeStrict would, for an
// object of tool_name, action, reason and conditions (an object of patterns,
// an array of strings), each at most once, with no nulls.
func decodeToolSpecFast(spec []byte) (*ToolPolicySpec, bool) {
	var s ToolPolicySpec
	var seen [4]bool
	end, ok := members(spec, skipSpace(spec, 0), func(key string, i int) (int, bool) {
		var n int
		var ok bool
		switch key {
		case "tool_name":
			n = 0
			s.ToolName, i, ok = jsonString(spec, i)
		case "action":
			n = 1
			s.Action, i, ok = jsonString(spec, i)
		case "reason":
			n = 2
			s.Reason, i, ok = jsonString(spec, i)
		case "conditions":
			n = 3
			s.Conditions, i, ok = decodeToolConditionsFast(spec, i)
		default:
			return 0, false
		}
		if !ok || seen[n] {
			return 0, false
		}
		seen[n] = true
		return i, true
	})
	if !ok || skipSpace(spec, end) != len(spec) {
		return nil, false
	}
	return &s, true
}

func decodeToolConditionsFast(b []byte, i int) (*ToolConditions, int, bool) {
	c := &ToolConditions{}
	end, ok := members(b, i, func(key string, i int) (int, bool) {
		if key != "patterns" || c.Patterns != nil {
			return 0, false
		}
		c.Patterns = []string{}
		return elements(b, i, func(i int) (int, bool) {
			p, i, ok := jsonString(b, i)
			c.Patterns = append(c.Patterns, p)
			return i, ok
		})
	})
	if !ok {
		return nil, 0, false
	}
	return c, end, true
}

// elements walks the array at b[i], calling element with the index of each
// element, which returns where the element ends. It returns the index after
// the closing bracket, or false when the array is malformed or element gives
// up.
func elements(b []byte, i int, element func(i int) (int, bool)) (int, bool) {
	if i >= len(b) || b[i] != '[' {
		return 0, false
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == ']' {
		return i + 1, true
	}
	for {
		var ok bool
		if i, ok = element(i); !ok {
			return 0, false
		}
		i = skipSpace(b, i)
		if i >= len(b) {
			return 0, false
		}
		if b[i] == ']' {
			return i + 1, true
		}
		if b[i] != ',' {
			return 0, false
		}
		i = skipSpace(b, i+1)
	}
}
