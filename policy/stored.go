package policy

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"strconv"
	"time"
)

// DecodeStored decodes a policy from its stored form: the JSON that
// AppendJSON and Canonical write, found in Raft commands and in the state
// file. The result is always what json.Unmarshal would give for the same
// bytes, and so is the error or its absence.
//
// Bytes in exactly AppendJSON's layout (fields in order, strings of
// printable ASCII without escapes, a spec nested at most maxFastDepth deep)
// take a fast path: one pass that validates the spec as JSON and finds its
// end, where json.Unmarshal makes two passes over it (validate, then decode
// into the RawMessage). Every replica decodes every 4 KB policy several times
// per write (the command, the version it replaces, the policy-set index), and
// those passes were a third of a replica's CPU under write load. Anything
// else falls back to json.Unmarshal, which is why the results agree
// (FuzzDecodeStored checks it).
//
// On the fast path p.Spec aliases data: callers pass bytes they own and do
// not modify afterwards.
func DecodeStored(data []byte) (*Policy, error) {
	if p, ok := decodeStoredFast(data); ok {
		return p, nil
	}
	var p Policy
	if err := json.Unmarshal(data, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// maxFastDepth bounds spec nesting on the fast path; deeper specs (none in
// practice) go to json.Unmarshal, whose own limit then applies exactly.
const maxFastDepth = 512

// storedReader walks bytes that are expected in AppendJSON's layout. Any
// step that finds something else reports false and the caller falls back.
type storedReader struct {
	b []byte
	i int
}

// lit consumes s verbatim.
func (r *storedReader) lit(s string) bool {
	if !bytes.HasPrefix(r.b[r.i:], []byte(s)) {
		return false
	}
	r.i += len(s)
	return true
}

// plainString consumes a plain JSON string (see the package's plainString).
func (r *storedReader) plainString() (string, bool) {
	s, end, ok := plainString(r.b, r.i)
	if ok {
		r.i = end
	}
	return s, ok
}

// field consumes `"name":` preceded by a comma unless first.
func (r *storedReader) field(name string, first bool) bool {
	if !first && !r.lit(",") {
		return false
	}
	return r.lit(`"`) && r.lit(name) && r.lit(`":`)
}

func (r *storedReader) stringField(name string, first bool) (string, bool) {
	if !r.field(name, first) {
		return "", false
	}
	return r.plainString()
}

func (r *storedReader) timeField(name string) (time.Time, bool) {
	var t time.Time
	if !r.field(name, false) {
		return t, false
	}
	start := r.i
	if _, ok := r.plainString(); !ok {
		return t, false
	}
	// json.Unmarshal hands the quoted literal to UnmarshalJSON too.
	if t.UnmarshalJSON(r.b[start:r.i]) != nil {
		return t, false
	}
	return t, true
}

func decodeStoredFast(data []byte) (*Policy, bool) {
	r := &storedReader{b: data}
	var p Policy
	var ok bool
	if !r.lit("{") {
		return nil, false
	}
	if p.Name, ok = r.stringField("name", true); !ok {
		return nil, false
	}
	if p.Kind, ok = r.stringField("kind", false); !ok {
		return nil, false
	}
	if !r.field("scope", false) || !r.lit("{") {
		return nil, false
	}
	if p.Scope.Org, ok = r.stringField("org", true); !ok {
		return nil, false
	}
	if p.Scope.Team, ok = r.stringField("team", false); !ok {
		return nil, false
	}
	if p.Scope.Employee, ok = r.stringField("employee", false); !ok {
		return nil, false
	}
	if !r.lit("}") {
		return nil, false
	}
	if r.lit(`,"labels":{`) {
		p.Labels = map[string]string{}
		for first := true; !r.lit("}"); first = false {
			if !first && !r.lit(",") {
				return nil, false
			}
			k, ok := r.plainString()
			if !ok || !r.lit(":") {
				return nil, false
			}
			v, ok := r.plainString()
			if !ok {
				return nil, false
			}
			p.Labels[k] = v
		}
	}
	if !r.field("spec", false) {
		return nil, false
	}
	end, ok := validValueEnd(data, r.i)
	if !ok {
		return nil, false
	}
	p.Spec = data[r.i:end:end]
	r.i = end
	if !r.field("revision", false) {
		return nil, false
	}
	start := r.i
	for r.i < len(data) && data[r.i] >= '0' && data[r.i] <= '9' {
		r.i++
	}
	digits := data[start:r.i]
	if len(digits) == 0 || (len(digits) > 1 && digits[0] == '0') {
		return nil, false
	}
	rev, err := strconv.ParseUint(string(digits), 10, 64)
	if err != nil {
		return nil, false
	}
	p.Revision = rev
	if p.CreatedAt, ok = r.timeField("created_at"); !ok {
		return nil, false
	}
	if p.UpdatedAt, ok = r.timeField("updated_at"); !ok {
		return nil, false
	}
	if !r.lit("}") || r.i != len(data) {
		return nil, false
	}
	return &p, true
}

// validValueEnd checks that a JSON value starts exactly at b[i] (no leading
// space) and returns where it ends. It accepts what encoding/json's scanner
// accepts, bytes at or above 0x20 in strings included (a RawMessage keeps
// them as they are); nesting deeper than maxFastDepth is refused so that the
// caller falls back.
func validValueEnd(b []byte, i int) (int, bool) {
	var stack [maxFastDepth]byte // the open containers: '{' or '['
	depth := 0
	for {
		// A value.
		if i >= len(b) {
			return 0, false
		}
		switch c := b[i]; {
		case c == '{' || c == '[':
			if depth == maxFastDepth {
				return 0, false
			}
			stack[depth] = c
			depth++
			i = skipSpace(b, i+1)
			if i < len(b) && b[i] == c+2 { // '}' is '{'+2, ']' is '['+2
				depth--
				i++
				break
			}
			if c == '{' {
				var ok bool
				if i, ok = objectKey(b, i); !ok {
					return 0, false
				}
			}
			continue
		case c == '"':
			var ok bool
			if i, ok = stringEnd(b, i); !ok {
				return 0, false
			}
		case c == '-' || (c >= '0' && c <= '9'):
			var ok bool
			if i, ok = numberEnd(b, i); !ok {
				return 0, false
			}
		case c == 't':
			if !bytes.HasPrefix(b[i:], []byte("true")) {
				return 0, false
			}
			i += 4
		case c == 'f':
			if !bytes.HasPrefix(b[i:], []byte("false")) {
				return 0, false
			}
			i += 5
		case c == 'n':
			if !bytes.HasPrefix(b[i:], []byte("null")) {
				return 0, false
			}
			i += 4
		default:
			return 0, false
		}
		// After a value: close containers or move to the next element.
		for {
			if depth == 0 {
				return i, true
			}
			i = skipSpace(b, i)
			if i >= len(b) {
				return 0, false
			}
			open := stack[depth-1]
			if b[i] == open+2 {
				depth--
				i++
				continue
			}
			if b[i] != ',' {
				return 0, false
			}
			i = skipSpace(b, i+1)
			if open == '{' {
				var ok bool
				if i, ok = objectKey(b, i); !ok {
					return 0, false
				}
			}
			break
		}
	}
}

// objectKey consumes `"key" :` and the space after it.
func objectKey(b []byte, i int) (int, bool) {
	if i >= len(b) || b[i] != '"' {
		return 0, false
	}
	i, ok := stringEnd(b, i)
	if !ok {
		return 0, false
	}
	i = skipSpace(b, i)
	if i >= len(b) || b[i] != ':' {
		return 0, false
	}
	return skipSpace(b, i+1), true
}

// stringEnd returns the index after the string starting at b[i] == '"'.
// Specs are mostly long strings (patterns, messages), so the plain runs
// between escapes are found with bytes.IndexByte and checked for control
// characters eight bytes at a time.
func stringEnd(b []byte, i int) (int, bool) {
	i++
	for {
		q := bytes.IndexByte(b[i:], '"')
		if q < 0 {
			return 0, false
		}
		run := b[i : i+q]
		esc := bytes.IndexByte(run, '\\')
		if esc < 0 {
			if hasControl(run) {
				return 0, false
			}
			return i + q + 1, true
		}
		if hasControl(run[:esc]) {
			return 0, false
		}
		i += esc + 1 // the byte after the backslash
		if i >= len(b) {
			return 0, false
		}
		switch b[i] {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			i++
		case 'u':
			if i+4 >= len(b) {
				return 0, false
			}
			for _, h := range b[i+1 : i+5] {
				if !isHex(h) {
					return 0, false
				}
			}
			i += 5
		default:
			return 0, false
		}
	}
}

// hasControl reports whether s holds a byte below 0x20, which JSON forbids
// in strings.
func hasControl(s []byte) bool {
	for len(s) >= 8 {
		// Nonzero exactly when some byte is below 0x20 (bytes at or above
		// 0x80 cannot set their high bit here: ^x clears it).
		x := binary.LittleEndian.Uint64(s)
		if (x-ones*0x20)&^x&highs != 0 {
			return true
		}
		s = s[8:]
	}
	for _, c := range s {
		if c < 0x20 {
			return true
		}
	}
	return false
}

func isHex(c byte) bool {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}

// numberEnd returns the index after the JSON number starting at b[i].
func numberEnd(b []byte, i int) (int, bool) {
	if b[i] == '-' {
		i++
	}
	digits := func() bool {
		start := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		return i > start
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case !digits():
		return 0, false
	}
	if i < len(b) && b[i] == '.' {
		i++
		if !digits() {
			return 0, false
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if !digits() {
			return 0, false
		}
	}
	return i, true
}
