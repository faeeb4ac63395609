package console

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"html/template"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"strings"
	"time"
)

// asset is one embedded file, with the ETag of its content.
type asset struct {
	body []byte
	etag string
	kind string
}

func loadAssets() (map[string]asset, error) {
	out := make(map[string]asset)
	err := fs.WalkDir(assetFS, "assets", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(assetFS, p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(b)
		out[path.Base(p)] = asset{body: b, etag: `"` + hex.EncodeToString(sum[:8]) + `"`, kind: mime.TypeByExtension(path.Ext(p))}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("console assets: %w", err)
	}
	return out, nil
}

// serveAsset serves a stylesheet or script. They hold no data, so they are
// served without a session and cached for an hour.
func (c *Console) serveAsset(w http.ResponseWriter, r *http.Request) {
	a, ok := c.assets[r.PathValue("file")]
	if !ok {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", a.kind)
	w.Header().Set("ETag", a.etag)
	w.Header().Set("Cache-Control", "public, max-age=3600")
	if r.Header.Get("If-None-Match") == a.etag {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	_, _ = w.Write(a.body)
}

// funcs are the templates' helpers. Every one returns plain text, which
// html/template escapes where it lands.
var funcs = template.FuncMap{
	"ago":   ago,
	"time":  func(t time.Time) string { return fmtTime(t) },
	"join":  strings.Join,
	"pct":   func(f float64) string { return fmt.Sprintf("%.0f%%", f*100) },
	"short": short,
	"add":   func(a, b int) int { return a + b },
	"until": func(t time.Time) string { return until(t) },
	"int":   func(v uint32) int { return int(v) },
	"list":  func(xs ...string) []string { return xs },
	"navItem": func(current, name, link, label string) navItem {
		return navItem{Link: link, Label: label, Current: current == name}
	},
}

// navItem is one entry of the menu.
type navItem struct {
	Link, Label string
	Current     bool
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

// ago is a duration for people: "4s ago", "3m ago", "2h ago".
func ago(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	d := time.Since(t)
	switch {
	case d < 0:
		return "just now"
	case d < time.Minute:
		return fmt.Sprintf("%ds ago", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm ago", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh ago", int(d.Hours()))
	}
	return fmt.Sprintf("%dd ago", int(d.Hours()/24))
}

func until(t time.Time) string {
	d := time.Until(t)
	if d <= 0 {
		return "now"
	}
	return "in " + d.Round(time.Second).String()
}

// short keeps the first n runes of s, for long versions and digests.
func short(n int, s string) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n]) + "…"
}
