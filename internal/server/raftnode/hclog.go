package raftnode

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"slices"

	"github.com/hashicorp/go-hclog"
)

// hclogAdapter routes hashicorp/raft's hclog output into the node's slog
// logger, so one handler decides format and level for everything.
type hclogAdapter struct {
	l    *slog.Logger
	name string
	args []any
}

var _ hclog.Logger = (*hclogAdapter)(nil)

// NewHCLog routes hclog output (raft's) to l, under component name.
func NewHCLog(l *slog.Logger, name string) hclog.Logger {
	return &hclogAdapter{l: l.With("component", name), name: name}
}

func toSlogLevel(level hclog.Level) slog.Level {
	switch level {
	case hclog.Trace, hclog.Debug:
		return slog.LevelDebug
	case hclog.Warn:
		return slog.LevelWarn
	case hclog.Error:
		return slog.LevelError
	default:
		return slog.LevelInfo
	}
}

func (a *hclogAdapter) Log(level hclog.Level, msg string, args ...any) {
	if level == hclog.Off {
		return
	}
	a.l.Log(context.Background(), toSlogLevel(level), msg, renderFormats(args)...)
}

func (a *hclogAdapter) Trace(msg string, args ...any) { a.Log(hclog.Trace, msg, args...) }
func (a *hclogAdapter) Debug(msg string, args ...any) { a.Log(hclog.Debug, msg, args...) }
func (a *hclogAdapter) Info(msg string, args ...any)  { a.Log(hclog.Info, msg, args...) }
func (a *hclogAdapter) Warn(msg string, args ...any)  { a.Log(hclog.Warn, msg, args...) }
func (a *hclogAdapter) Error(msg string, args ...any) { a.Log(hclog.Error, msg, args...) }

func (a *hclogAdapter) enabled(l slog.Level) bool { return a.l.Enabled(context.Background(), l) }

func (a *hclogAdapter) IsTrace() bool { return a.enabled(slog.LevelDebug) }
func (a *hclogAdapter) IsDebug() bool { return a.enabled(slog.LevelDebug) }
func (a *hclogAdapter) IsInfo() bool  { return a.enabled(slog.LevelInfo) }
func (a *hclogAdapter) IsWarn() bool  { return a.enabled(slog.LevelWarn) }
func (a *hclogAdapter) IsError() bool { return a.enabled(slog.LevelError) }

func (a *hclogAdapter) ImpliedArgs() []any { return a.args }

func (a *hclogAdapter) With(args ...any) hclog.Logger {
	return &hclogAdapter{l: a.l.With(args...), name: a.name, args: append(append([]any{}, a.args...), args...)}
}

func (a *hclogAdapter) Name() string { return a.name }

func (a *hclogAdapter) Named(name string) hclog.Logger {
	n := name
	if a.name != "" {
		n = a.name + "." + name
	}
	return &hclogAdapter{l: a.l.With("subsystem", name), name: n, args: a.args}
}

func (a *hclogAdapter) ResetNamed(name string) hclog.Logger {
	return &hclogAdapter{l: a.l.With("subsystem", name), name: name, args: a.args}
}

// SetLevel is a no-op: the slog handler owns the level.
func (a *hclogAdapter) SetLevel(hclog.Level) {}

func (a *hclogAdapter) GetLevel() hclog.Level {
	switch {
	case a.enabled(slog.LevelDebug):
		return hclog.Debug
	case a.enabled(slog.LevelInfo):
		return hclog.Info
	case a.enabled(slog.LevelWarn):
		return hclog.Warn
	default:
		return hclog.Error
	}
}

func (a *hclogAdapter) StandardLogger(opts *hclog.StandardLoggerOptions) *log.Logger {
	return log.New(a.StandardWriter(opts), "", 0)
}

func (a *hclogAdapter) StandardWriter(*hclog.StandardLoggerOptions) io.Writer {
	return slogWriter{a}
}

type slogWriter struct{ a *hclogAdapter }

func (w slogWriter) Write(p []byte) (int, error) {
	msg := string(p)
	for len(msg) > 0 && msg[len(msg)-1] == '\n' {
		msg = msg[:len(msg)-1]
	}
	w.a.Info(msg)
	return len(p), nil
}

// renderFormats expands hclog.Fmt values (raft logs its configuration with
// them), which slog would otherwise print as the raw format and arguments.
// The caller's slice is never modified.
func renderFormats(args []any) []any {
	out := args
	for i, v := range args {
		f, ok := v.(hclog.Format)
		if !ok || len(f) == 0 {
			continue
		}
		format, ok := f[0].(string)
		if !ok {
			continue
		}
		if &out[0] == &args[0] {
			out = slices.Clone(args)
		}
		out[i] = fmt.Sprintf(format, f[1:]...)
	}
	return out
}
