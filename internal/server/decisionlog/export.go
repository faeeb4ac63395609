package decisionlog

import (
	"fmt"
	"os"
	"sync"

	"github.com/policyd/policyd/internal/decisions"
)

// exporter appends every kept record as one JSON line to a file a log
// shipper tails, and rotates it to FILE.1 at maxBytes: one old file, which
// a shipper that follows renames reads to its end.
type exporter struct {
	path     string
	maxBytes int64

	mu   sync.Mutex
	f    *os.File
	size int64
}

func newExporter(path string, maxBytes int64) (*exporter, error) {
	e := &exporter{path: path, maxBytes: maxBytes}
	if err := e.open(); err != nil {
		return nil, err
	}
	return e, nil
}

func (e *exporter) open() error {
	f, err := os.OpenFile(e.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
	if err != nil {
		return fmt.Errorf("open decision export: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("open decision export: %w", err)
	}
	e.f, e.size = f, fi.Size()
	return nil
}

// write appends recs in one write, rotating first if they would take the
// file past maxBytes.
func (e *exporter) write(recs []decisions.Record) error {
	var b []byte
	for _, r := range recs {
		b = append(append(b, r.Data...), '\n')
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.f == nil {
		if err := e.open(); err != nil {
			return err
		}
	}
	if e.size > 0 && e.size+int64(len(b)) > e.maxBytes {
		if err := e.rotate(); err != nil {
			return err
		}
	}
	n, err := e.f.Write(b)
	e.size += int64(n)
	if err != nil {
		return fmt.Errorf("write decision export: %w", err)
	}
	return nil
}

func (e *exporter) rotate() error {
	if err := e.f.Close(); err != nil {
		return fmt.Errorf("rotate decision export: %w", err)
	}
	e.f = nil
	if err := os.Rename(e.path, e.path+".1"); err != nil {
		return fmt.Errorf("rotate decision export: %w", err)
	}
	return e.open()
}

func (e *exporter) close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.f == nil {
		return nil
	}
	err := e.f.Close()
	e.f = nil
	return err
}
