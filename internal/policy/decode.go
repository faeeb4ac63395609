package policy

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	jsonv1 "github.com/go-json-experiment/json/v1"
)

// strictOptions add the refusal of unknown members to jsonv2's defaults,
// which already refuse duplicate names and invalid UTF-8 and match names
// case-sensitively. Where jsonv2 is stricter than encoding/json in other
// ways (a one-digit hour, "01" in a `json:",string"` number), it keeps
// encoding/json's rules, as DecodeStrict always has; but a Go array must
// get exactly its length.
var strictOptions = jsonv2.JoinOptions(
	jsonv2.RejectUnknownMembers(true),
	jsonv1.ParseTimeWithLooseRFC3339(true),
	jsonv1.StringifyWithLegacySemantics(true),
)

// maxFieldErrors bounds how many field errors DecodeStrict reports: each
// one after the first costs another decode of the input.
const maxFieldErrors = 20

// DecodeStrict decodes exactly one JSON value from data into v, which must be
// a non-nil pointer. It is stricter than encoding/json so that a typo in a
// request is reported instead of silently dropped:
//   - object keys must match a field's JSON name exactly (encoding/json would
//     also accept a case-insensitive match);
//   - unknown and duplicate keys, anywhere in the value, are rejected;
//   - strings must be valid UTF-8, without unpaired surrogate escapes;
//   - a value of the wrong JSON type, or a number that does not fit its field,
//     is rejected;
//   - anything but whitespace after the value is rejected.
//
// Every problem, up to maxFieldErrors, is reported as a [ValidationError]
// naming the field by its JSON path ("scope.org", "spec.conditions.patterns[2]",
// `labels["tier"]`), so errors.Is(err, ErrInvalid) holds. Syntax errors, an
// empty input and trailing data are reported alone, with an empty field and
// the byte offset, in encoding/json's words. On error, v may be partly filled.
func DecodeStrict(data []byte, v any) error {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		// A programming error, not bad input: it does not wrap ErrInvalid.
		return fmt.Errorf("decode JSON: need a non-nil pointer, got %T", v)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return ValidationError{{Reason: "empty body: expected a JSON value"}}
	}
	err := jsonv2.Unmarshal(data, v, strictOptions)
	if err == nil {
		return nil
	}
	if reason := syntaxError(data); reason != "" {
		return ValidationError{{Reason: reason}}
	}
	return fieldErrors(data, rv.Type().Elem(), err)
}

// syntaxError describes the first syntax error in data, or data after its
// first value, as DecodeStrict always has: encoding/json's message and the
// offset of the offending byte (the input's length for a truncated input).
// It returns "" for one well-formed value.
func syntaxError(data []byte) string {
	var raw json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&raw); err != nil {
		// Unmarshal reports the same error with a reliable offset.
		var se *json.SyntaxError
		if !errors.As(json.Unmarshal(data, &raw), &se) {
			return fmt.Sprintf("invalid JSON: %v", err)
		}
		msg := strings.TrimPrefix(se.Error(), "json: ")
		if msg == "unexpected end of JSON input" {
			return fmt.Sprintf("invalid JSON at offset %d: unexpected end of input", len(data))
		}
		// SyntaxError.Offset counts the bytes read, including the bad one.
		return fmt.Sprintf("invalid JSON at offset %d: %s", se.Offset-1, msg)
	}
	if off := skipSpace(data, int(dec.InputOffset())); off < len(data) {
		return fmt.Sprintf("unexpected data after the JSON value at offset %d", off)
	}
	return ""
}

// fieldErrors turns err, jsonv2's first error decoding well-formed data into
// a t, into field errors, and finds the later ones by decoding again without
// the member or element at fault until the decode succeeds.
func fieldErrors(data []byte, t reflect.Type, err error) ValidationError {
	var errs ValidationError
	for len(errs) < maxFieldErrors {
		ptr, dupAt, fe := describe(data, t, err)
		errs = append(errs, fe)
		if ptr == "" {
			break // the whole value is wrong: nothing left to decode
		}
		if data, err = omit(data, ptr, dupAt); err != nil {
			break
		}
		if err = jsonv2.Unmarshal(data, reflect.New(t).Interface(), strictOptions); err == nil {
			break
		}
	}
	return errs
}

// describe returns the field error for err, where in data it is, and for
// a duplicate name, the offset of the duplicate. An empty ptr means that the
// error cannot be decoded past.
func describe(data []byte, t reflect.Type, err error) (ptr jsontext.Pointer, dupAt int64, fe FieldError) {
	var syn *jsontext.SyntacticError
	if errors.As(err, &syn) {
		fe = FieldError{Field: fieldPath(data, t, syn.JSONPointer), Reason: syn.Err.Error()}
		if errors.Is(syn.Err, jsontext.ErrDuplicateName) {
			fe.Reason = "duplicate field"
			return syn.JSONPointer, syn.ByteOffset, fe
		}
		// Invalid UTF-8, most likely; it stops the decode, so stop here.
		return "", -1, fe
	}
	var sem *jsonv2.SemanticError
	if !errors.As(err, &sem) || sem.GoType == nil {
		return "", -1, FieldError{Reason: err.Error()}
	}
	fe = FieldError{Field: fieldPath(data, t, sem.JSONPointer), Reason: semanticReason(data, sem)}
	return sem.JSONPointer, -1, fe
}

var (
	timeType            = reflect.TypeFor[time.Time]()
	jsonUnmarshalerType = reflect.TypeFor[json.Unmarshaler]()
)

// semanticReason says what is wrong with a well-formed value, in the words
// DecodeStrict has always used.
func semanticReason(data []byte, sem *jsonv2.SemanticError) string {
	t, got := sem.GoType, kindName(sem.JSONKind)
	// jsonv2 names the number in JSONValue when it parsed it itself.
	number := isNumber(t) && len(sem.JSONValue) > 0
	switch {
	case errors.Is(sem.Err, jsonv2.ErrUnknownName):
		return "unknown field"
	case number && errors.Is(sem.Err, strconv.ErrRange):
		return fmt.Sprintf("number %s out of range for %s", literal(sem.JSONValue), numberName(t))
	case number && errors.Is(sem.Err, strconv.ErrSyntax):
		return fmt.Sprintf("expected %s, got number %s", numberName(t), literal(sem.JSONValue))
	case t == timeType && sem.Err != nil:
		return fmt.Sprintf("expected RFC 3339 time, got %s", valueAt(data, sem.JSONPointer))
	case t == timeType:
		return "expected RFC 3339 time string, got " + got
	case sem.Err == nil && suits(got, t):
		// Then the field is tagged `json:",string"` and wants it quoted.
		return fmt.Sprintf("expected string containing a %s, got %s", scalarName(t), got)
	case sem.Err == nil:
		return fmt.Sprintf("expected %s, got %s", wantName(t), got)
	case t.Kind() == reflect.Array:
		var elems []jsontext.Value
		_ = jsonv2.Unmarshal(valueAt(data, sem.JSONPointer), &elems)
		if len(elems) > t.Len() {
			return fmt.Sprintf("at most %d elements, got %d", t.Len(), len(elems))
		}
		return fmt.Sprintf("at least %d elements, got %d", t.Len(), len(elems))
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Uint8:
		var ce base64.CorruptInputError
		if errors.As(sem.Err, &ce) {
			return "expected base64 string: " + ce.Error()
		}
	}
	return sem.Err.Error()
}

// kindName names a JSON kind as the error messages do.
func kindName(k jsontext.Kind) string {
	switch k {
	case '{':
		return "object"
	case '[':
		return "array"
	case '"':
		return "string"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	case '0':
		return "number"
	}
	return k.String()
}

// wantName names the JSON type that Go type t decodes from.
func wantName(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Struct, reflect.Map:
		return "object"
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Uint8 {
			return "base64 string"
		}
		return "array"
	case reflect.Array:
		return "array"
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "boolean"
	}
	return numberName(t)
}

// suits reports whether a JSON value of type got decodes into Go type t.
func suits(got string, t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Bool:
		return got == "boolean"
	case reflect.String:
		return got == "string"
	}
	return got == "number" && isNumber(t)
}

func isNumber(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr,
		reflect.Float32, reflect.Float64:
		return true
	}
	return false
}

func scalarName(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "JSON string"
	case reflect.Bool:
		return "boolean"
	}
	return numberName(t)
}

func numberName(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "integer"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return "non-negative integer"
	}
	return "number"
}

// literal is a number as written, unquoted if it came from a string (a
// `json:",string"` field or a map key).
func literal(v jsontext.Value) string {
	if s, err := strconv.Unquote(string(v)); err == nil {
		return s
	}
	return string(v)
}

// fieldPath writes ptr, a JSON Pointer into data decoded as a t, in
// DecodeStrict's notation: struct fields joined with dots, map keys as
// ["key"], array indexes as [i]. Inside values that the Go type does not
// describe (an interface, a json.RawMessage) object members are joined with
// dots.
func fieldPath(data []byte, t reflect.Type, ptr jsontext.Pointer) string {
	var isArray []bool
	if _, loc, ok := seek(data, ptr, -1); ok {
		isArray = loc.isArray
	}
	var b strings.Builder
	i := 0
	for tok := range ptr.Tokens() {
		for t != nil && t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		kind := reflect.Invalid
		if t != nil && !reflect.PointerTo(t).Implements(jsonUnmarshalerType) {
			kind = t.Kind()
		}
		switch {
		case kind == reflect.Map:
			fmt.Fprintf(&b, "[%q]", tok)
			t = t.Elem()
		case kind == reflect.Slice || kind == reflect.Array:
			fmt.Fprintf(&b, "[%s]", tok)
			t = t.Elem()
		case kind == reflect.Struct:
			if b.Len() > 0 {
				b.WriteByte('.')
			}
			b.WriteString(tok)
			t = fieldType(t, tok)
		case i < len(isArray) && isArray[i]:
			fmt.Fprintf(&b, "[%s]", tok)
			t = nil
		default:
			if b.Len() > 0 {
				b.WriteByte('.')
			}
			b.WriteString(tok)
			t = nil
		}
		i++
	}
	return b.String()
}

// fieldType returns the type of struct t's field with JSON name name,
// looking into embedded structs, or nil if there is none.
func fieldType(t reflect.Type, name string) reflect.Type {
	for i := range t.NumField() {
		f := t.Field(i)
		tag, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		ft := f.Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		switch {
		case tag == "-":
		case f.Anonymous && tag == "" && ft.Kind() == reflect.Struct:
			if found := fieldType(ft, name); found != nil {
				return found
			}
		case tag == name || (tag == "" && f.Name == name):
			return f.Type
		}
	}
	return nil
}

// location says where seek found a value.
type location struct {
	isArray []bool // for each token of the pointer, whether it indexes an array
	prevEnd int64  // the offset after the token before the member or element
	first   bool   // whether the member or element is the first in its container
}

// seek returns a decoder of data about to read the value at ptr, and where
// that value is. It follows the first member with each name, except that
// when dupAt >= 0 the last one must be the member whose name starts at
// dupAt. It reads each value once at most, however deep ptr goes.
func seek(data []byte, ptr jsontext.Pointer, dupAt int64) (*jsontext.Decoder, location, bool) {
	dec := jsontext.NewDecoder(bytes.NewReader(data), jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true))
	var loc location
	toks := slices.Collect(ptr.Tokens())
	for i, want := range toks {
		open, err := dec.ReadToken()
		if err != nil || (open.Kind() != '{' && open.Kind() != '[') {
			return nil, loc, false
		}
		loc.isArray = append(loc.isArray, open.Kind() == '[')
		last := i == len(toks)-1
		for n := 0; ; n++ {
			if k := dec.PeekKind(); k == '}' || k == ']' || k == 0 {
				return nil, loc, false
			}
			loc.prevEnd, loc.first = dec.InputOffset(), n == 0
			var match bool
			if open.Kind() == '[' {
				match = strconv.Itoa(n) == want
			} else {
				name, err := dec.ReadToken()
				if err != nil {
					return nil, loc, false
				}
				match = name.String() == want &&
					(!last || dupAt < 0 || (loc.prevEnd <= dupAt && dupAt < dec.InputOffset()))
			}
			if match {
				break
			}
			if err := dec.SkipValue(); err != nil {
				return nil, loc, false
			}
		}
	}
	return dec, loc, true
}

// valueAt returns the value at ptr in data, or nil.
func valueAt(data []byte, ptr jsontext.Pointer) jsontext.Value {
	dec, _, ok := seek(data, ptr, -1)
	if !ok {
		return nil
	}
	v, err := dec.ReadValue()
	if err != nil {
		return nil
	}
	return v
}

// omit returns data without the object member at ptr, or with the array
// element at ptr replaced by null (so that later indexes stay the same), for
// jsonv2 to decode past that error. See seek for which member it is.
func omit(data []byte, ptr jsontext.Pointer, dupAt int64) ([]byte, error) {
	dec, loc, ok := seek(data, ptr, dupAt)
	if !ok || ptr == "" {
		return nil, fmt.Errorf("no member or element at %q", ptr)
	}
	if err := dec.SkipValue(); err != nil {
		return nil, fmt.Errorf("skip %q: %w", ptr, err)
	}
	start, end := int(loc.prevEnd), int(dec.InputOffset())
	var with string
	switch {
	case loc.isArray[len(loc.isArray)-1] && loc.first:
		with = "null"
	case loc.isArray[len(loc.isArray)-1]:
		with = ",null"
	case loc.first:
		// Take the comma after the member instead of the one before.
		if i := skipSpace(data, end); i < len(data) && data[i] == ',' {
			end = i + 1
		}
	}
	return slices.Concat(data[:start], []byte(with), data[end:]), nil
}

// skipSpace returns the index of the first byte at or after i that is not
// JSON whitespace.
func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// DecodePolicy strictly decodes a policy from a request body. The
// cluster-managed fields (revision, created_at, updated_at) are accepted so
// that a client can send back what it read, but they are zeroed: the cluster
// sets them when it commits the write.
func DecodePolicy(data []byte) (*Policy, error) {
	var p Policy
	if err := DecodeStrict(data, &p); err != nil {
		return nil, err
	}
	p.Revision = 0
	p.CreatedAt = time.Time{}
	p.UpdatedAt = time.Time{}
	return &p, nil
}

// DecodeEmployee strictly decodes an employee from a request body. As with
// DecodePolicy, cluster-managed fields are accepted and zeroed. A missing
// status means active, so that creating an employee needs only id and org.
func DecodeEmployee(data []byte) (*Employee, error) {
	var e Employee
	if err := DecodeStrict(data, &e); err != nil {
		return nil, err
	}
	e.Revision = 0
	e.CreatedAt = time.Time{}
	e.UpdatedAt = time.Time{}
	if e.Status == "" {
		e.Status = StatusActive
	}
	return &e, nil
}
