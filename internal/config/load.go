package config

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"sort"
	"strings"

	"github.com/spf13/pflag"
	"github.com/spf13/viper"
)

// flagKeys maps serve's flags to the keys they set. Only the keys an operator
// commonly changes per node have flags; everything else goes in the file or
// the environment.
var flagKeys = []struct{ flag, key, usage string }{
	{"data-dir", "data_dir", "directory for the state database, the Raft log and snapshots"},
	{"node-id", "node_id", "Raft server ID of this node (default: persisted ID, else host name)"},
	{"http-addr", "http.addr", "listen address of the admin API and WebSocket feed"},
	{"grpc-addr", "grpc.addr", "listen address of sidecar discovery and the cluster API"},
	{"raft-addr", "raft.addr", "listen address of the Raft transport"},
	{"bootstrap", "raft.bootstrap", "form the initial cluster from raft.peers when there is no Raft state"},
	{"log-level", "log.level", "debug, info, warn or error"},
}

// configFlag names the flag that points at the config file.
const configFlag = "config"

// RegisterFlags defines serve's flags on fs: --config (path to the config
// file), --data-dir, --node-id, --http-addr, --grpc-addr, --raft-addr,
// --bootstrap and --log-level. Their defaults are Default()'s, shown in
// --help; only flags given explicitly override the file and the environment.
func RegisterFlags(fs *pflag.FlagSet) {
	d := Default()
	fs.String(configFlag, "", "path to the YAML config file (see config.example.yaml)")
	for _, f := range flagKeys {
		def := fieldOf(&d, leaf(f.key))
		if def.Kind() == reflect.Bool {
			fs.Bool(f.flag, def.Bool(), f.usage)
		} else {
			fs.String(f.flag, fmt.Sprint(def.Interface()), f.usage)
		}
	}
}

// leaf returns the schema node of a known key; flagKeys is checked by a test.
func leaf(key string) *node {
	for _, l := range schema().leaves() {
		if l.key == key {
			return l
		}
	}
	panic("config: unknown key " + key)
}

// Load builds a Config from, lowest precedence first: Default(), the YAML
// file at path, POLICYD_* variables in environ, and the flags of fs that were
// set explicitly. path "" means no file, unless fs has --config set. fs may be
// nil. The result is validated.
//
// environ is passed in rather than read so that tests (and callers embedding
// policyd) control it; main passes os.Environ().
func Load(path string, environ []string, fs *pflag.FlagSet) (Config, error) {
	if path == "" && fs != nil {
		if f := fs.Lookup(configFlag); f != nil && f.Changed {
			path = f.Value.String()
		}
	}

	v := viper.New()
	src := sources{file: path, fileKeys: map[string]bool{}, envKeys: map[string]string{}, flagKeys: map[string]string{}}

	d := Default()
	for _, l := range schema().leaves() {
		if val := fieldOf(&d, l); !isEmptyList(val.Interface()) {
			v.SetDefault(l.key, val.Interface())
		}
	}

	if path != "" {
		raw, err := readFile(path)
		if err != nil {
			return Config{}, err
		}
		if errs := checkKeys(schema(), raw, "", src.fileKeys); len(errs) > 0 {
			return Config{}, prefixAll(fmt.Sprintf("config file %q", path), errs)
		}
		if err := v.MergeConfigMap(raw); err != nil {
			return Config{}, fmt.Errorf("config file %q: %w", path, err)
		}
	}

	// viper's own environment binding reads the process environment, so the
	// variables are parsed here and merged as a layer over the file.
	env, err := parseEnv(environ, src.envKeys)
	if err != nil {
		return Config{}, err
	}
	if err := v.MergeConfigMap(env); err != nil {
		return Config{}, fmt.Errorf("environment: %w", err)
	}

	if fs != nil {
		for _, f := range flagKeys {
			pf := fs.Lookup(f.flag)
			if pf == nil {
				continue
			}
			// viper only takes a bound flag's value when it was changed, so
			// defaults on fs never mask the file or the environment.
			if err := v.BindPFlag(f.key, pf); err != nil {
				return Config{}, fmt.Errorf("bind flag --%s: %w", f.flag, err)
			}
			if pf.Changed {
				src.flagKeys[f.key] = "--" + f.flag
			}
		}
	}

	cfg, err := decode(v, src)
	if err != nil {
		return Config{}, err
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// sources remembers where each key was set so that a decoding error points
// at the place to fix.
type sources struct {
	file     string
	fileKeys map[string]bool   // leaf keys present in the file
	envKeys  map[string]string // leaf key → variable name
	flagKeys map[string]string // leaf key → --flag
}

// origin describes where the effective value of the leaf key came from.
func (s sources) origin(key string) string {
	if f, ok := s.flagKeys[key]; ok {
		return "flag " + f
	}
	if e, ok := s.envKeys[key]; ok {
		return "environment variable " + e
	}
	if s.fileKeys[key] {
		return fmt.Sprintf("config file %q", s.file)
	}
	return "default"
}

// readFile parses the YAML file at path into a raw map, using viper's own
// codec so the keys checked are exactly the ones viper will see.
func readFile(path string) (map[string]any, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config file %q: %w", path, err)
	}
	dec, err := viper.NewCodecRegistry().Decoder("yaml")
	if err != nil {
		return nil, fmt.Errorf("config file %q: %w", path, err)
	}
	raw := map[string]any{}
	if err := dec.Decode(data, raw); err != nil {
		// The yaml error already carries the line ("yaml: line 3: ...").
		return nil, fmt.Errorf("config file %q: %w", path, err)
	}
	return raw, nil
}

// checkKeys reports every key in val that n does not define, and the
// mappings and lists that have the wrong shape to be walked. It records the
// known leaf keys it meets in seen (nil inside list entries, which are set
// with their list).
func checkKeys(n *node, val any, path string, seen map[string]bool) []error {
	switch {
	case n.isStruct():
		if val == nil {
			return nil // "raft:" with nothing under it
		}
		m, ok := asMap(val)
		if !ok {
			return []error{fmt.Errorf("%s: %s is not a mapping", displayPath(path), describe(val))}
		}
		var errs []error
		folded := map[string]string{}
		for _, name := range sortedKeys(m) {
			full := joinPath(path, name)
			// viper folds case, so "Raft" and "raft" would overwrite each
			// other in map order: reject rather than pick one at random.
			if prev, dup := folded[strings.ToLower(name)]; dup {
				errs = append(errs, fmt.Errorf("key %q repeats %q (keys are case-insensitive)", full, joinPath(path, prev)))
				continue
			}
			folded[strings.ToLower(name)] = name
			if strings.Contains(name, ".") {
				// viper would read a dotted key as a path and let it shadow the
				// nested form; one spelling per key keeps precedence clear.
				errs = append(errs, fmt.Errorf("key %q contains a dot: nest it instead (%s)", full, nestedHint(name)))
				continue
			}
			c := n.child(name)
			if c == nil {
				msg := fmt.Sprintf("unknown key %q", full)
				if s := suggest(n, name, path); s != "" {
					msg += fmt.Sprintf(" (did you mean %q?)", s)
				}
				errs = append(errs, errors.New(msg))
				continue
			}
			if seen != nil && !c.isStruct() && m[name] != nil {
				seen[c.key] = true
			}
			errs = append(errs, checkKeys(c, m[name], full, seen)...)
		}
		return errs
	case n.elem != nil:
		list, ok := val.([]any)
		if !ok {
			return nil // decode reports the type, with the value's origin
		}
		var errs []error
		for i, e := range list {
			if _, ok := asMap(e); !ok {
				continue // decode reports it
			}
			errs = append(errs, checkKeys(n.elem, e, fmt.Sprintf("%s[%d]", path, i), nil)...)
		}
		return errs
	}
	return nil
}

func displayPath(path string) string {
	if path == "" {
		return "config"
	}
	return path
}

func nestedHint(dotted string) string {
	parts := strings.Split(dotted, ".")
	return strings.Join(parts, ": {") + ": ..." + strings.Repeat("}", len(parts)-1)
}

// parseEnv turns the POLICYD_* variables of environ that name a known key
// into a nested map for viper, recording which variable set which key.
// Variables for unknown keys are left alone: the CLI's own POLICYD_*
// settings share the prefix. An empty value counts as unset, as in viper.
// A later duplicate wins, as in exec.Cmd.
func parseEnv(environ []string, setBy map[string]string) (map[string]any, error) {
	byName := map[string]*node{}
	for _, l := range schema().leaves() {
		byName[envName(l.key)] = l
	}
	values := map[string]string{}
	for _, kv := range environ {
		name, value, ok := strings.Cut(kv, "=")
		if !ok || !strings.HasPrefix(name, envPrefix) || byName[name] == nil {
			continue
		}
		if value == "" {
			delete(values, name)
			continue
		}
		values[name] = value
	}

	out := map[string]any{}
	var errs []error
	for _, name := range sortedKeys(values) {
		l := byName[name]
		val, err := envValue(l, values[name])
		if err != nil {
			errs = append(errs, fmt.Errorf("environment variable %s: %s: %w", name, l.key, err))
			continue
		}
		setNested(out, l.key, val)
		setBy[l.key] = name
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}

// envValue converts a variable's text for key l. Scalars stay strings and
// are converted by decode like any other source; lists have a flat syntax.
func envValue(l *node, s string) (any, error) {
	switch {
	case l.elem != nil && l.typ.Elem() == reflect.TypeFor[Peer]():
		// raft.peers as id=address,id=address.
		var peers []any
		for _, entry := range strings.Split(s, ",") {
			id, addr, ok := strings.Cut(strings.TrimSpace(entry), "=")
			if !ok {
				return nil, fmt.Errorf("entry %q is not id=address", entry)
			}
			peers = append(peers, map[string]any{"id": strings.TrimSpace(id), "address": strings.TrimSpace(addr)})
		}
		return peers, nil
	case l.elem != nil:
		return nil, errors.New("cannot be set from the environment; use the config file")
	case l.typ.Kind() == reflect.Slice:
		var items []any
		for _, item := range strings.Split(s, ",") {
			items = append(items, strings.TrimSpace(item))
		}
		return items, nil
	}
	return s, nil
}

func setNested(m map[string]any, key string, val any) {
	parts := strings.Split(key, ".")
	for _, p := range parts[:len(parts)-1] {
		next, ok := m[p].(map[string]any)
		if !ok {
			next = map[string]any{}
			m[p] = next
		}
		m = next
	}
	m[parts[len(parts)-1]] = val
}

// prefixAll joins errs, each prefixed with where it was found.
func prefixAll(where string, errs []error) error {
	out := make([]error, len(errs))
	for i, err := range errs {
		out[i] = fmt.Errorf("%s: %w", where, err)
	}
	return errors.Join(out...)
}

// asMap accepts both map shapes the YAML decoder produces.
func asMap(val any) (map[string]any, bool) {
	switch m := val.(type) {
	case map[string]any:
		return m, true
	case map[any]any:
		out := make(map[string]any, len(m))
		for k, v := range m {
			out[fmt.Sprint(k)] = v
		}
		return out, true
	}
	return nil, false
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
