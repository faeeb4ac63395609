package config

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/viper"
)

// decode reads every known key from v into a Config. It does the type
// conversions itself instead of viper.Unmarshal so that each error names the
// key and the value, and so that no conversion is silent: a bare integer is
// not a duration (cast would read 1000 as 1µs) and 007 is not a string.
func decode(v *viper.Viper, src sources) (Config, error) {
	cfg := Default()
	var errs []error
	for _, l := range schema().leaves() {
		val := v.Get(l.key)
		if val == nil {
			continue // null or absent everywhere: keep the default
		}
		if err := setValue(fieldOf(&cfg, l), l, val, l.key); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", src.origin(l.key), err))
		}
	}
	if len(errs) > 0 {
		return Config{}, errors.Join(errs...)
	}
	return cfg, nil
}

func fieldOf(cfg *Config, l *node) reflect.Value {
	return reflect.ValueOf(cfg).Elem().FieldByIndex(l.index)
}

func isEmptyList(v any) bool {
	rv := reflect.ValueOf(v)
	return rv.Kind() == reflect.Slice && rv.Len() == 0
}

// setValue converts val into dst, the field described by n. key is the
// display path used in errors ("raft.peers[1].id"). Errors already name key.
func setValue(dst reflect.Value, n *node, val any, key string) error {
	t := dst.Type()
	if val == nil {
		// Only list entries get here: a null top-level key keeps its default.
		return fmt.Errorf("%s: null is not allowed here", key)
	}
	if rv := reflect.ValueOf(val); rv.Type() == t {
		// Defaults come back from viper in their Go types.
		if rv.Kind() == reflect.Slice && rv.Len() == 0 {
			dst.SetZero() // an empty list is the same as none (and equals Default)
			return nil
		}
		dst.Set(rv)
		return nil
	}

	switch {
	case t == durationType:
		d, err := toDuration(val)
		if err != nil {
			return fmt.Errorf("%s: %w", key, err)
		}
		dst.SetInt(int64(d))
	case t.Kind() == reflect.Slice:
		list, ok := toList(val)
		if !ok {
			return fmt.Errorf("%s: %s is not a list", key, describe(val))
		}
		if len(list) == 0 {
			dst.SetZero()
			return nil
		}
		out := reflect.MakeSlice(t, len(list), len(list))
		var errs []error
		for i, e := range list {
			ek := fmt.Sprintf("%s[%d]", key, i)
			if n.elem != nil {
				errs = append(errs, setStruct(out.Index(i), n.elem, e, ek))
			} else {
				errs = append(errs, setValue(out.Index(i), &node{typ: t.Elem()}, e, ek))
			}
		}
		if err := errors.Join(errs...); err != nil {
			return err
		}
		dst.Set(out)
	case t.Kind() == reflect.String:
		s, ok := val.(string)
		if !ok {
			if isScalar(val) {
				return fmt.Errorf("%s: %s is not a string (quote it: \"%v\")", key, describe(val), val)
			}
			return fmt.Errorf("%s: %s is not a string", key, describe(val))
		}
		dst.SetString(s)
	case t.Kind() == reflect.Bool:
		b, err := toBool(val)
		if err != nil {
			return fmt.Errorf("%s: %w", key, err)
		}
		dst.SetBool(b)
	case dst.CanInt():
		i, err := toInt(val)
		if err != nil {
			return fmt.Errorf("%s: %w", key, err)
		}
		if dst.OverflowInt(i) {
			return fmt.Errorf("%s: %d is out of range", key, i)
		}
		dst.SetInt(i)
	case dst.CanUint():
		i, err := toInt(val)
		var u uint64
		switch {
		case errors.Is(err, errTooBig):
			// Only an unsigned value can exceed int64.
			u, err = toUint(val)
		case err == nil && i < 0:
			err = fmt.Errorf("%d is negative", i)
		default:
			u = uint64(i)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", key, err)
		}
		if dst.OverflowUint(u) {
			return fmt.Errorf("%s: %d is out of range", key, u)
		}
		dst.SetUint(u)
	default:
		// A field type added to Config without a conversion here.
		return fmt.Errorf("%s: cannot decode into %s", key, t)
	}
	return nil
}

// setStruct decodes one list entry (a mapping) into dst. Unknown keys in a
// file's entries were rejected before; here only types are checked.
func setStruct(dst reflect.Value, n *node, val any, key string) error {
	m, ok := asMap(val)
	if !ok {
		return fmt.Errorf("%s: %s is not a mapping", key, describe(val))
	}
	var errs []error
	for _, f := range n.fields {
		name := lastSegment(f.key)
		for k, fv := range m {
			if !strings.EqualFold(k, name) || fv == nil {
				continue
			}
			errs = append(errs, setValue(dst.FieldByIndex(f.index), f, fv, key+"."+name))
		}
	}
	return errors.Join(errs...)
}

var errTooBig = errors.New("too big")

func toDuration(val any) (time.Duration, error) {
	switch v := val.(type) {
	case string:
		d, err := time.ParseDuration(strings.TrimSpace(v))
		if err != nil {
			return 0, fmt.Errorf("%q is not a duration (Go syntax with a unit, e.g. \"200ms\" or \"1h30m\")", v)
		}
		return d, nil
	case int, int64, uint64:
		// A bare number has no unit; guessing one is how timeouts end up
		// a million times too short.
		return 0, fmt.Errorf("%v is not a duration: give a unit, e.g. \"%vms\" or \"%vs\"", v, v, v)
	}
	return 0, fmt.Errorf("%s is not a duration (Go syntax with a unit, e.g. \"200ms\")", describe(val))
}

func toBool(val any) (bool, error) {
	switch v := val.(type) {
	case bool:
		return v, nil
	case string:
		// Environment variables and flags arrive as text.
		if b, err := strconv.ParseBool(strings.TrimSpace(v)); err == nil {
			return b, nil
		}
	}
	return false, fmt.Errorf("%s is not a boolean (true or false)", describe(val))
}

// toInt accepts integers and their decimal text (from the environment). It
// returns errTooBig (wrapped) for an unsigned value beyond int64.
func toInt(val any) (int64, error) {
	switch v := val.(type) {
	case int:
		return int64(v), nil
	case int64:
		return v, nil
	case uint64:
		if v > math.MaxInt64 {
			return 0, fmt.Errorf("%d is %w", v, errTooBig)
		}
		return int64(v), nil
	case string:
		s := strings.TrimSpace(v)
		i, err := strconv.ParseInt(s, 10, 64)
		if err == nil {
			return i, nil
		}
		if _, uerr := strconv.ParseUint(s, 10, 64); uerr == nil {
			return 0, fmt.Errorf("%q is %w", v, errTooBig)
		}
		if errors.Is(err, strconv.ErrRange) {
			return 0, fmt.Errorf("%q is out of range", v)
		}
	}
	return 0, fmt.Errorf("%s is not an integer", describe(val))
}

func toUint(val any) (uint64, error) {
	switch v := val.(type) {
	case uint64:
		return v, nil
	case string:
		if u, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64); err == nil {
			return u, nil
		}
	}
	return 0, fmt.Errorf("%s is not a non-negative integer", describe(val))
}

// toList accepts the YAML decoder's []any and any Go slice.
func toList(val any) ([]any, bool) {
	if l, ok := val.([]any); ok {
		return l, true
	}
	rv := reflect.ValueOf(val)
	if rv.Kind() != reflect.Slice {
		return nil, false
	}
	out := make([]any, rv.Len())
	for i := range out {
		out[i] = rv.Index(i).Interface()
	}
	return out, true
}

func isScalar(val any) bool {
	switch val.(type) {
	case int, int64, uint64, float64, bool:
		return true
	}
	return false
}

// describe renders a value for an error message the way the user wrote it,
// as far as the decoded form allows.
func describe(val any) string {
	switch v := val.(type) {
	case nil:
		return "null"
	case string:
		return strconv.Quote(v)
	case float64:
		return strconv.FormatFloat(v, 'g', -1, 64)
	}
	if _, ok := asMap(val); ok {
		return "a mapping"
	}
	if rv := reflect.ValueOf(val); rv.Kind() == reflect.Slice {
		return "a list"
	}
	return fmt.Sprint(val)
}
