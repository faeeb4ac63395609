// Package utf8field finds the field of a request whose text is not valid
// UTF-8, so that every listener can refuse the request with 400 (gRPC:
// InvalidArgument) naming that field instead of storing or serving text
// that every JSON and protobuf encoder downstream would mangle or refuse.
// JSON and Proto read the raw request and count a lone-surrogate \u escape
// as invalid; each returns an *Error naming the first bad field, or nil.
// Syntax is not their business: the decoder reports it. See docs/design.md.
package utf8field

import (
	"bytes"
	"encoding/json"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Error names a field whose text is not valid UTF-8.
type Error struct {
	// Field says where: "spec.conditions.patterns[1]", "a member name in
	// labels", "query parameter org", "scope.team".
	Field string
}

func (e *Error) Error() string { return e.Field + " is not valid UTF-8" }

// Query checks the names and values of URL query parameters, in name
// order, so that the field named does not depend on map order.
func Query(q url.Values) error {
	names := make([]string, 0, len(q))
	for name := range q {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if !utf8.ValidString(name) {
			return &Error{Field: "a query parameter name"}
		}
		for _, v := range q[name] {
			if !utf8.ValidString(v) {
				return &Error{Field: "query parameter " + name}
			}
		}
	}
	return nil
}

// JSON checks every string of the JSON text data, member names included.
// A string is named by its path from the top ("spec.labels[\"a/b\"]",
// "items[2].name"); the top-level value, if it is a string, is "the JSON
// value".
func JSON(data []byte) error {
	if utf8.Valid(data) && !hasSurrogateEscape(data) {
		return nil // the common case: nothing to walk
	}
	var (
		path []frame
		prev int64
	)
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber() // a number too large for a float64 is not an error here
	for {
		tok, err := dec.Token()
		if err != nil {
			return nil // the end, or not JSON: the caller's decoder says so
		}
		off := dec.InputOffset()
		raw := data[prev:off]
		prev = off
		var top *frame
		if len(path) > 0 {
			top = &path[len(path)-1]
		}
		switch t := tok.(type) {
		case json.Delim:
			switch t {
			case '{', '[':
				path = append(path, frame{object: t == '{', wantKey: t == '{'})
			default:
				path = path[:len(path)-1]
				if len(path) > 0 {
					path[len(path)-1].valueDone()
				}
			}
		case string:
			if top != nil && top.object && top.wantKey {
				if !validLiteral(raw) {
					if in := pathString(path[:len(path)-1]); in != "" {
						return &Error{Field: "a member name in " + in}
					}
					return &Error{Field: "a member name of the top-level object"}
				}
				top.key, top.wantKey = t, false
				continue
			}
			if !validLiteral(raw) {
				if top == nil {
					return &Error{Field: "the JSON value"}
				}
				return &Error{Field: pathString(path)}
			}
			if top != nil {
				top.valueDone()
			}
		default:
			if top != nil {
				top.valueDone()
			}
		}
	}
}

// frame is one open object or array on JSON's path.
type frame struct {
	object  bool
	wantKey bool   // object: the next string is a member name
	key     string // object: the current member's name
	index   int    // array: the current element's index
}

func (f *frame) valueDone() {
	if f.object {
		f.wantKey = true
	} else {
		f.index++
	}
}

// pathString names the value path leads to; "" for the top level.
func pathString(path []frame) string {
	var b strings.Builder
	for i, f := range path {
		switch {
		case !f.object:
			b.WriteString("[" + strconv.Itoa(f.index) + "]")
		case plainKey(f.key):
			if i > 0 {
				b.WriteByte('.')
			}
			b.WriteString(f.key)
		default:
			b.WriteString("[" + strconv.Quote(f.key) + "]")
		}
	}
	return b.String()
}

// plainKey: a member name that reads unambiguously after a dot.
func plainKey(k string) bool {
	if k == "" {
		return false
	}
	return strings.IndexFunc(k, func(r rune) bool {
		return (r < 'a' || r > 'z') && (r < 'A' || r > 'Z') && (r < '0' || r > '9') && r != '_' && r != '-'
	}) < 0
}

// hasSurrogateEscape reports whether data may hold a \u escape of a UTF-16
// surrogate (\uD800 to \uDFFF). It may say yes for an escaped backslash
// followed by "uD8…", which only costs the walk.
func hasSurrogateEscape(data []byte) bool {
	for {
		i := bytes.Index(data, []byte(`\u`))
		if i < 0 || i+3 >= len(data) {
			return false
		}
		if (data[i+2] == 'd' || data[i+2] == 'D') && strings.IndexByte("89abcdefABCDEF", data[i+3]) >= 0 {
			return true
		}
		data = data[i+2:]
	}
}

// validLiteral reports whether raw, a string token as the decoder read it
// (possibly after a separator and white space), is valid UTF-8 and its \u
// escapes pair every surrogate.
func validLiteral(raw []byte) bool {
	i := bytes.IndexByte(raw, '"')
	if i < 0 {
		return true
	}
	lit := raw[i:]
	if !utf8.Valid(lit) {
		return false
	}
	for i := 0; i < len(lit); i++ {
		if lit[i] != '\\' {
			continue
		}
		if i+1 < len(lit) && lit[i+1] != 'u' {
			i++ // a two-character escape
			continue
		}
		r, ok := hex4(lit, i+2)
		if !ok {
			return true // the decoder refuses it
		}
		i += 5
		switch {
		case !utf16.IsSurrogate(r):
		case r >= 0xdc00: // a low surrogate with no high one before it
			return false
		default:
			low, ok := rune(0), i+2 < len(lit) && lit[i+1] == '\\' && lit[i+2] == 'u'
			if ok {
				low, ok = hex4(lit, i+3)
			}
			if !ok || utf16.DecodeRune(r, low) == utf8.RuneError {
				return false
			}
			i += 6
		}
	}
	return true
}

func hex4(b []byte, i int) (rune, bool) {
	if i+4 > len(b) {
		return 0, false
	}
	v, err := strconv.ParseUint(string(b[i:i+4]), 16, 32)
	return rune(v), err == nil
}

// Proto checks every string field of the protobuf wire-format message b of
// type md (proto3, where protobuf-go requires valid UTF-8), in nested
// messages and map entries too. A field is named by its
// path of proto field names ("scope.team", "labels.value"); a repeated
// field's element by its index ("names[2]").
func Proto(md protoreflect.MessageDescriptor, b []byte) error {
	if field := protoField(md, b); field != "" {
		return &Error{Field: field}
	}
	return nil
}

func protoField(md protoreflect.MessageDescriptor, b []byte) string {
	seen := map[protowire.Number]int{}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return ""
		}
		b = b[n:]
		fd := md.Fields().ByNumber(num)
		if typ != protowire.BytesType || fd == nil {
			if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
				return ""
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return ""
		}
		b = b[n:]
		name := string(fd.Name())
		if fd.IsList() {
			name += "[" + strconv.Itoa(seen[num]) + "]"
			seen[num]++
		}
		switch fd.Kind() {
		case protoreflect.StringKind:
			if !utf8.Valid(v) {
				return name
			}
		case protoreflect.MessageKind:
			if inner := protoField(fd.Message(), v); inner != "" {
				return name + "." + inner
			}
		}
	}
	return ""
}
