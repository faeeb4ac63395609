package policy

import (
	"bytes"
	"encoding"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"
)

// DecodeStrict decodes exactly one JSON value from data into v, which must be
// a non-nil pointer. It is stricter than encoding/json so that a typo in a
// request is reported instead of silently dropped:
//   - object keys must match a field's JSON name exactly (encoding/json would
//     also accept a case-insensitive match);
//   - unknown and duplicate keys are rejected;
//   - a value of the wrong JSON type, or a number that does not fit its field,
//     is rejected;
//   - anything but whitespace after the value is rejected.
//
// Every problem is reported as a [ValidationError] naming the field by its JSON
// path ("scope.org", "spec.conditions.patterns[2]", `labels["tier"]`), so
// errors.Is(err, ErrInvalid) holds. Syntax errors, an empty input and trailing
// data are reported with an empty field and the byte offset. Fields of type
// json.RawMessage and interface types take any well-formed JSON value.
func DecodeStrict(data []byte, v any) error {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		// A programming error, not bad input: it does not wrap ErrInvalid.
		return fmt.Errorf("decode JSON: need a non-nil pointer, got %T", v)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return ValidationError{{Reason: "empty body: expected a JSON value"}}
	}

	d := &strictDecoder{data: data, dec: json.NewDecoder(bytes.NewReader(data))}
	d.dec.UseNumber()
	if err := d.value(rv.Type().Elem(), "", false); err != nil {
		return ValidationError{{Reason: d.syntaxReason(err)}}
	}
	if off := d.next(); off < len(data) {
		return ValidationError{{Reason: fmt.Sprintf("unexpected data after the JSON value at offset %d", off)}}
	}
	if len(d.errs) > 0 {
		return d.errs
	}

	// The walk above has checked everything encoding/json would, so this only
	// fills v. An error here means the walk missed a case; still report it
	// as bad input rather than losing it.
	if err := json.Unmarshal(data, v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return ValidationError{{Field: te.Field, Reason: fmt.Sprintf("expected %s, got %s", te.Type, te.Value)}}
		}
		return ValidationError{{Reason: err.Error()}}
	}
	return nil
}

// strictDecoder walks one JSON document against a Go type. Only syntax and
// I/O errors stop the walk; field errors are collected in errs so that a
// client sees all of them at once.
type strictDecoder struct {
	data []byte
	dec  *json.Decoder
	errs ValidationError
}

var (
	jsonUnmarshalerType = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshalerType = reflect.TypeFor[encoding.TextUnmarshaler]()
	timeType            = reflect.TypeFor[time.Time]()
)

func (d *strictDecoder) fail(field, format string, args ...any) {
	d.errs = append(d.errs, FieldError{Field: field, Reason: fmt.Sprintf(format, args...)})
}

// syntaxReason describes a syntax error with the offset of the offending
// byte (0-based; the input's length for a truncated input). json.Decoder's
// own offsets are not reliable once Token and Decode calls are mixed, so
// the input is scanned again: the walk stopped inside the first value, so
// a full scan fails at the same place.
func (d *strictDecoder) syntaxReason(err error) string {
	var raw json.RawMessage
	var se *json.SyntaxError
	if errors.As(json.Unmarshal(d.data, &raw), &se) {
		msg := strings.TrimPrefix(se.Error(), "json: ")
		if msg == "unexpected end of JSON input" {
			return fmt.Sprintf("invalid JSON at offset %d: unexpected end of input", len(d.data))
		}
		// SyntaxError.Offset counts the bytes read, including the bad one.
		return fmt.Sprintf("invalid JSON at offset %d: %s", se.Offset-1, msg)
	}
	return fmt.Sprintf("invalid JSON: %v", err)
}

// next returns the offset of the next significant byte, skipping whitespace
// and the single ':' or ',' that json.Decoder consumes lazily with the next
// value. It returns len(data) at the end of the input.
func (d *strictDecoder) next() int {
	i := int(d.dec.InputOffset())
	i = skipSpace(d.data, i)
	if i < len(d.data) && (d.data[i] == ':' || d.data[i] == ',') {
		i = skipSpace(d.data, i+1)
	}
	return i
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// peek names the JSON type of the next value from its first byte, or returns
// "" when the input is malformed there (the decoder then reports why).
func (d *strictDecoder) peek() string {
	i := d.next()
	if i >= len(d.data) {
		return ""
	}
	switch c := d.data[i]; {
	case c == '{':
		return "object"
	case c == '[':
		return "array"
	case c == '"':
		return "string"
	case c == 't' || c == 'f':
		return "boolean"
	case c == 'n':
		return "null"
	case c == '-' || (c >= '0' && c <= '9'):
		return "number"
	}
	return ""
}

// skip consumes the next value, checking only its syntax.
func (d *strictDecoder) skip() error {
	var raw json.RawMessage
	return d.dec.Decode(&raw)
}

// mismatch records a type error for the next value and skips it.
func (d *strictDecoder) mismatch(path, want, got string) error {
	if got == "" {
		// Malformed input: let the decoder produce the syntax error.
		return d.skip()
	}
	d.fail(path, "expected %s, got %s", want, got)
	return d.skip()
}

// value checks the next JSON value against t. quoted is set for fields
// tagged `json:",string"`, whose scalar is wrapped in a JSON string.
func (d *strictDecoder) value(t reflect.Type, path string, quoted bool) error {
	got := d.peek()
	if got == "null" {
		// encoding/json leaves the target unchanged for null, whatever its type.
		return d.skip()
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}

	if t == timeType {
		return d.timeValue(path, got)
	}
	if reflect.PointerTo(t).Implements(jsonUnmarshalerType) {
		return d.unmarshalerValue(t, path)
	}
	if reflect.PointerTo(t).Implements(textUnmarshalerType) {
		return d.textValue(t, path, got)
	}

	if quoted {
		switch t.Kind() {
		case reflect.Bool, reflect.String, reflect.Float32, reflect.Float64,
			reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
			reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
			return d.quotedValue(t, path, got)
		}
	}

	switch t.Kind() {
	case reflect.Interface:
		return d.skip()
	case reflect.Struct:
		if got != "object" {
			return d.mismatch(path, "object", got)
		}
		return d.object(path, func(key string) (reflect.Type, string, bool, bool) {
			f, ok := fieldsOf(t)[key]
			return f.typ, joinField(path, key), f.quoted, ok
		})
	case reflect.Map:
		if got != "object" {
			return d.mismatch(path, "object", got)
		}
		return d.object(path, func(key string) (reflect.Type, string, bool, bool) {
			p := fmt.Sprintf("%s[%q]", path, key)
			if !d.validMapKey(t.Key(), key, p) {
				return nil, p, false, true
			}
			return t.Elem(), p, false, true
		})
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Uint8 && !reflect.PointerTo(t.Elem()).Implements(jsonUnmarshalerType) &&
			!reflect.PointerTo(t.Elem()).Implements(textUnmarshalerType) {
			return d.bytesValue(path, got)
		}
		return d.array(t, path, got)
	case reflect.Array:
		return d.array(t, path, got)
	case reflect.String:
		if got != "string" {
			return d.mismatch(path, "string", got)
		}
		_, err := d.dec.Token()
		return err
	case reflect.Bool:
		if got != "boolean" {
			return d.mismatch(path, "boolean", got)
		}
		_, err := d.dec.Token()
		return err
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr,
		reflect.Float32, reflect.Float64:
		if got != "number" {
			return d.mismatch(path, numberName(t), got)
		}
		tok, err := d.dec.Token()
		if err != nil {
			return err
		}
		d.checkNumber(t, path, string(tok.(json.Number)))
		return nil
	default:
		d.fail(path, "cannot decode into a field of Go type %s", t)
		return d.skip()
	}
}

// object walks an object's members. field resolves a key to the type and
// path of its value; ok=false means the key is unknown, and a nil type with
// ok=true means the key itself was rejected.
func (d *strictDecoder) object(path string, field func(key string) (t reflect.Type, p string, quoted, ok bool)) error {
	if _, err := d.dec.Token(); err != nil { // '{'
		return err
	}
	seen := make(map[string]bool)
	for d.dec.More() {
		tok, err := d.dec.Token()
		if err != nil {
			return err
		}
		key, isString := tok.(string)
		if !isString {
			// Unreachable: json.Decoder only yields string keys inside objects.
			return fmt.Errorf("object key is %T, not a string", tok)
		}
		ft, p, quoted, ok := field(key)
		switch {
		case seen[key]:
			d.fail(p, "duplicate field")
			err = d.skip()
		case !ok:
			d.fail(p, "unknown field")
			err = d.skip()
		case ft == nil:
			err = d.skip()
		default:
			err = d.value(ft, p, quoted)
		}
		if err != nil {
			return err
		}
		seen[key] = true
	}
	_, err := d.dec.Token() // '}'
	return err
}

func (d *strictDecoder) array(t reflect.Type, path, got string) error {
	if got != "array" {
		return d.mismatch(path, "array", got)
	}
	if _, err := d.dec.Token(); err != nil { // '['
		return err
	}
	n := 0
	for ; d.dec.More(); n++ {
		if err := d.value(t.Elem(), fmt.Sprintf("%s[%d]", path, n), false); err != nil {
			return err
		}
	}
	if t.Kind() == reflect.Array && n > t.Len() {
		// encoding/json would drop the extra elements without a word.
		d.fail(path, "at most %d elements, got %d", t.Len(), n)
	}
	_, err := d.dec.Token() // ']'
	return err
}

// timeValue insists on an RFC 3339 string, with time.Time's own parser so
// that the result agrees with what json.Unmarshal will do.
func (d *strictDecoder) timeValue(path, got string) error {
	if got != "string" {
		return d.mismatch(path, "RFC 3339 time string", got)
	}
	tok, err := d.dec.Token()
	if err != nil {
		return err
	}
	var tm time.Time
	if err := tm.UnmarshalText([]byte(tok.(string))); err != nil {
		d.fail(path, "expected RFC 3339 time, got %q", tok)
	}
	return nil
}

func (d *strictDecoder) unmarshalerValue(t reflect.Type, path string) error {
	var raw json.RawMessage
	if err := d.dec.Decode(&raw); err != nil {
		return err
	}
	u := reflect.New(t).Interface().(json.Unmarshaler)
	if err := u.UnmarshalJSON(raw); err != nil {
		d.fail(path, "%v", err)
	}
	return nil
}

func (d *strictDecoder) textValue(t reflect.Type, path, got string) error {
	if got != "string" {
		return d.mismatch(path, "string", got)
	}
	tok, err := d.dec.Token()
	if err != nil {
		return err
	}
	u := reflect.New(t).Interface().(encoding.TextUnmarshaler)
	if err := u.UnmarshalText([]byte(tok.(string))); err != nil {
		d.fail(path, "%v", err)
	}
	return nil
}

func (d *strictDecoder) bytesValue(path, got string) error {
	if got != "string" {
		return d.mismatch(path, "base64 string", got)
	}
	tok, err := d.dec.Token()
	if err != nil {
		return err
	}
	if _, err := base64.StdEncoding.DecodeString(tok.(string)); err != nil {
		d.fail(path, "expected base64 string: %v", err)
	}
	return nil
}

// quotedValue handles `json:",string"`: a scalar inside a JSON string.
func (d *strictDecoder) quotedValue(t reflect.Type, path, got string) error {
	if got != "string" {
		return d.mismatch(path, "string containing a "+scalarName(t), got)
	}
	tok, err := d.dec.Token()
	if err != nil {
		return err
	}
	s := tok.(string)
	switch t.Kind() {
	case reflect.String:
		var inner string
		if err := json.Unmarshal([]byte(s), &inner); err != nil {
			d.fail(path, "expected a quoted JSON string inside the string, got %q", s)
		}
	case reflect.Bool:
		if s != "true" && s != "false" {
			d.fail(path, "expected \"true\" or \"false\", got %q", s)
		}
	default:
		d.checkNumber(t, path, s)
	}
	return nil
}

// checkNumber reports a number literal that t cannot hold exactly:
// a fraction or exponent for an integer, a negative unsigned, an overflow.
func (d *strictDecoder) checkNumber(t reflect.Type, path, s string) {
	var err error
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		_, err = strconv.ParseInt(s, 10, t.Bits())
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		_, err = strconv.ParseUint(s, 10, t.Bits())
	case reflect.Float32, reflect.Float64:
		_, err = strconv.ParseFloat(s, t.Bits())
	}
	if err == nil {
		return
	}
	if errors.Is(err, strconv.ErrRange) {
		d.fail(path, "number %s out of range for %s", s, numberName(t))
		return
	}
	d.fail(path, "expected %s, got number %s", numberName(t), s)
}

// validMapKey checks a key against the map's key type the way encoding/json
// converts it, and records the error when it does not fit.
func (d *strictDecoder) validMapKey(kt reflect.Type, key, path string) bool {
	if reflect.PointerTo(kt).Implements(textUnmarshalerType) {
		u := reflect.New(kt).Interface().(encoding.TextUnmarshaler)
		if err := u.UnmarshalText([]byte(key)); err != nil {
			d.fail(path, "invalid key: %v", err)
			return false
		}
		return true
	}
	switch kt.Kind() {
	case reflect.String:
		return true
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		n := len(d.errs)
		d.checkNumber(kt, path, key)
		return len(d.errs) == n
	}
	d.fail(path, "cannot decode into a map with Go key type %s", kt)
	return false
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

func scalarName(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "JSON string"
	case reflect.Bool:
		return "boolean"
	}
	return numberName(t)
}

func joinField(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// structField is what the walk needs to know about one JSON member of a struct.
type structField struct {
	typ    reflect.Type
	quoted bool
}

var fieldCache sync.Map // reflect.Type -> map[string]structField

// fieldsOf returns the JSON members of struct type t by exact name,
// following encoding/json's rules for tags, unexported fields and embedded
// structs. Where two embedded fields at the same depth share a name,
// encoding/json drops both; so do we, which makes the key unknown.
func fieldsOf(t reflect.Type) map[string]structField {
	if f, ok := fieldCache.Load(t); ok {
		return f.(map[string]structField)
	}
	type found struct {
		f     structField
		depth int
		n     int
	}
	all := make(map[string]*found)
	var walk func(t reflect.Type, depth int, visited map[reflect.Type]bool)
	walk = func(t reflect.Type, depth int, visited map[reflect.Type]bool) {
		if visited[t] {
			return
		}
		visited[t] = true
		defer delete(visited, t)
		for i := range t.NumField() {
			sf := t.Field(i)
			tag := sf.Tag.Get("json")
			if tag == "-" {
				continue
			}
			name, opts, _ := strings.Cut(tag, ",")
			ft := sf.Type
			if sf.Anonymous {
				et := ft
				if et.Kind() == reflect.Pointer {
					et = et.Elem()
				}
				if !sf.IsExported() && et.Kind() != reflect.Struct {
					continue
				}
				if name == "" && et.Kind() == reflect.Struct {
					walk(et, depth+1, visited)
					continue
				}
			} else if !sf.IsExported() {
				continue
			}
			if name == "" {
				name = sf.Name
			}
			quoted := false
			for o := range strings.SplitSeq(opts, ",") {
				quoted = quoted || o == "string"
			}
			cur := all[name]
			switch {
			case cur == nil || depth < cur.depth:
				all[name] = &found{f: structField{typ: ft, quoted: quoted}, depth: depth, n: 1}
			case depth == cur.depth:
				cur.n++
			}
		}
	}
	walk(t, 0, map[reflect.Type]bool{})
	fields := make(map[string]structField, len(all))
	for name, f := range all {
		if f.n == 1 {
			fields[name] = f.f
		}
	}
	fieldCache.Store(t, fields)
	return fields
}

// DecodePolicy strictly decodes a policy from a request body. The
// cluster-managed fields (revision, created_at, updated_at) are accepted so
// that a client can send back what it read, but they are zeroed: the cluster
// sets them when it commits the write.
func DecodePolicy(data []byte) (*Policy, error) {
	if p, ok := decodePolicyFast(data); ok {
		return p, nil
	}
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
