package server

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"

	"github.com/policyd/policyd/internal/auth"
	"github.com/policyd/policyd/internal/config"
)

// Run-time settings (SIGHUP).
//
// ApplySettings takes a freshly loaded configuration and applies what can change
// without a restart: log.level, the admin tokens file, the JWT secret and key
// files, the TLS certificate files, drift.callbacks, and whatever else is
// registered with AddSettingsHook. Every other key that differs from the
// configuration the node started with is reported as needing a restart and
// keeps its running value. Comparing with the start-up configuration rather
// than the previous reload keeps reporting a pending change on every SIGHUP
// until the restart happens.
//
// File-backed settings are re-read on every reload even when their keys did
// not change, since SIGHUP is how an operator says "the files changed". A
// file that does not load keeps the previous version in force; the error is
// returned and logged, and the other settings are still applied. The paths
// themselves (auth.jwt.*, *.tls.*) and turning admin auth or TLS on or off
// need a restart: they change what a listener is, not what it holds.

// SettingsHook applies run-time settings from a reloaded configuration.
type SettingsHook struct {
	// Name is for errors and logs.
	Name string
	// Keys are the configuration keys the hook applies at run time: a
	// changed key that no hook lists needs a restart.
	Keys []string
	// Apply is called on every reload, whether or not Keys changed (a file
	// the hook reads may have). It returns the settings it applied, the
	// keys among its own it could not apply without a restart, and an
	// error when a setting could not be applied (its previous value then
	// stays in force).
	Apply func(cfg config.Config) (applied, needRestart []string, err error)
}

// settings is the Node's run-time settings state.
type settings struct {
	mu    sync.Mutex // serializes reloads
	level *slog.LevelVar
	hooks []SettingsHook
}

// SetLogLevel gives the node the level variable of its logger's handler, so
// that ApplySettings can change log.level. Without it, a changed log.level needs a
// restart.
func (n *Node) SetLogLevel(v *slog.LevelVar) {
	n.settings.mu.Lock()
	defer n.settings.mu.Unlock()
	n.settings.level = v
}

// AddSettingsHook registers settings that ApplySettings applies at run time.
func (n *Node) AddSettingsHook(h SettingsHook) {
	n.settings.mu.Lock()
	defer n.settings.mu.Unlock()
	n.settings.hooks = append(n.settings.hooks, h)
}

// ApplySettings applies cfg's run-time settings (see the section comment above) and
// returns what it applied and the changed keys that need a restart, both
// sorted. err joins the settings that could not be applied; the others are
// in force regardless. A cfg that does not validate changes nothing.
func (n *Node) ApplySettings(cfg config.Config) (applied, needRestart []string, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, nil, fmt.Errorf("invalid configuration, nothing reloaded: %w", err)
	}
	n.settings.mu.Lock()
	defer n.settings.mu.Unlock()
	hooks := append([]SettingsHook{
		{Name: "log level", Keys: []string{"log.level"}, Apply: n.applyLogLevel},
		{Name: "admin tokens", Keys: []string{"auth.admin_tokens_file"}, Apply: n.applyAdminTokens},
		{Name: "jwt keys", Apply: n.applyJWT},
		{Name: "tls certificates", Apply: n.applyTLS},
		{Name: "cluster secret", Keys: []string{"cluster.secret_file"}, Apply: n.applyClusterSecret},
		{Name: "drift callbacks", Keys: []string{"drift.callbacks"}, Apply: n.applyDriftCallbacks},
	}, n.settings.hooks...)

	var errs []error
	runtime := map[string]bool{}
	for _, h := range hooks {
		for _, k := range h.Keys {
			runtime[k] = true
		}
		a, r, err := h.Apply(cfg)
		applied = append(applied, a...)
		needRestart = append(needRestart, r...)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", h.Name, err))
		}
	}
	for _, k := range config.ChangedKeys(n.cfg, cfg) {
		if !runtime[k] {
			needRestart = append(needRestart, k)
		}
	}
	slices.Sort(applied)
	slices.Sort(needRestart)
	applied, needRestart = slices.Compact(applied), slices.Compact(needRestart)
	err = errors.Join(errs...)

	n.logger.Info("configuration reloaded", "applied", strings.Join(applied, ","))
	if len(needRestart) > 0 {
		n.logger.Warn("configuration change needs a restart; the running values stay in force until then",
			"keys", strings.Join(needRestart, ","))
	}
	if err != nil {
		n.logger.Error("configuration reload incomplete; the previous values of these settings stay in force", "err", err)
	}
	return applied, needRestart, err
}

func (n *Node) applyLogLevel(cfg config.Config) (applied, needRestart []string, err error) {
	if n.settings.level == nil {
		if cfg.Log.Level != n.cfg.Log.Level {
			return nil, []string{"log.level"}, nil
		}
		return nil, nil, nil
	}
	var l slog.Level
	if err := l.UnmarshalText([]byte(cfg.Log.Level)); err != nil {
		return nil, nil, fmt.Errorf("log.level: %w", err) // refused by Validate already
	}
	if l == n.settings.level.Level() {
		return nil, nil, nil
	}
	n.settings.level.Set(l)
	return []string{"log.level"}, nil, nil
}

// applyAdminTokens loads the tokens file again, or a new one if the path
// changed. Turning admin auth on or off needs a restart: the one would lock
// out every client in flight, the other open the API on a signal.
func (n *Node) applyAdminTokens(cfg config.Config) (applied, needRestart []string, err error) {
	path := cfg.Auth.AdminTokensFile
	if (path == "") != (n.cfg.Auth.AdminTokensFile == "") {
		return nil, []string{"auth.admin_tokens_file"}, nil
	}
	if path == "" {
		return nil, nil, nil
	}
	t, err := auth.LoadAdminTokens(path)
	if err != nil {
		return nil, nil, fmt.Errorf("auth.admin_tokens_file: %w", err)
	}
	n.api.SetTokens(t)
	return []string{"auth.admin_tokens_file"}, nil, nil
}

// applyClusterSecret re-reads the cluster secrets: that is how a secret
// rotates (docs/security.md). Turning the secret on or off, or moving the
// file, needs a restart: the peers' handshakes would fail half-way.
func (n *Node) applyClusterSecret(cfg config.Config) (applied, needRestart []string, err error) {
	if cfg.Cluster.SecretFile != n.cfg.Cluster.SecretFile {
		return nil, []string{"cluster.secret_file"}, nil
	}
	if n.keys == nil {
		return nil, nil, nil
	}
	if err := n.keys.Reread(); err != nil {
		return nil, nil, fmt.Errorf("cluster.secret_file: %w", err)
	}
	return []string{"cluster.secret_file"}, nil, nil
}

// applyJWT re-reads the JWT secret or key files. With auth.mode none there
// is no verifier, and changing the mode needs a restart.
func (n *Node) applyJWT(config.Config) (applied, needRestart []string, err error) {
	if n.verifier == nil {
		return nil, nil, nil
	}
	if err := n.verifier.Reread(); err != nil {
		return nil, nil, fmt.Errorf("auth.jwt: %w", err)
	}
	return []string{"auth.jwt"}, nil, nil
}
