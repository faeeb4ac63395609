// Package boltcheck verifies that a bbolt file is whole before bbolt opens
// it, since bbolt trusts its file and a truncated or overwritten one makes it
// read past its mapping (SIGBUS) or panic. Check reads the file with ReadAt
// instead, walks what bbolt relies on (meta pages, reachable pages, keys,
// the free list), and fails with an error naming the first problem it
// finds. It does not check values, which bbolt carries without a checksum.
// See docs/design.md.
package boltcheck

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
)

// ErrDamaged is wrapped by every error Check returns for a file that is not
// a whole bbolt database.
var ErrDamaged = errors.New("damaged bbolt file")

// bbolt's on-disk format (go.etcd.io/bbolt/internal/common).
const (
	magic          = 0xED0CDAED
	version        = 2
	pageHeaderSize = 16 // id u64, flags u16, count u16, overflow u32
	elementSize    = 16 // branch: pos u32, ksize u32, pgid u64; leaf: flags, pos, ksize, vsize u32
	bucketHeader   = 16 // root pgid u64, sequence u64
	metaChecksumAt = 56 // meta bytes covered by the checksum
	metaSize       = 64

	branchFlag   = 0x01
	leafFlag     = 0x02
	freelistFlag = 0x10
	bucketLeaf   = 0x01
	noFreelist   = ^uint64(0)

	minPageSize = 1024
	maxPageSize = 1 << 24
)

var order = binary.NativeEndian

// Meta is what the meta page bbolt would use says about the file.
type Meta struct {
	PageSize uint32
	Root     uint64 // root page of the top-level bucket tree
	Freelist uint64 // page of the persisted free list, or ^0 if none
	HighMark uint64 // pages in use: the file must hold at least this many
	TxID     uint64
}

// Check verifies the bbolt file at path. A missing or empty file is not
// damaged (bbolt creates it); any other problem wraps ErrDamaged, except
// failures to read the file, which are returned as they are.
func Check(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if fi.Size() == 0 {
		return nil
	}
	_, err = CheckReader(f, fi.Size())
	return err
}

// CheckReader verifies a bbolt file of size bytes read from r and returns
// the meta page in force.
func CheckReader(r io.ReaderAt, size int64) (Meta, error) {
	m, err := readMeta(r, size)
	if err != nil {
		return Meta{}, err
	}
	c := &checker{r: r, meta: m, pageSize: uint64(m.PageSize), seen: map[uint64]bool{0: true, 1: true}}
	if _, err := c.tree(m.Root, nil, nil); err != nil {
		return m, err
	}
	if m.Freelist != noFreelist {
		if err := c.freelist(); err != nil {
			return m, err
		}
	}
	return m, nil
}

func damaged(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrDamaged, fmt.Sprintf(format, args...))
}

// readMeta finds the page size and the meta page bbolt would use: the valid
// one with the higher transaction id.
func readMeta(r io.ReaderAt, size int64) (Meta, error) {
	if size < 2*minPageSize {
		return Meta{}, damaged("the file is %d bytes, shorter than two meta pages", size)
	}
	var metas [2]Meta
	var errs [2]error
	metas[0], errs[0] = readMetaAt(r, size, 0)
	pageSize := int64(metas[0].PageSize)
	if errs[0] != nil {
		// Meta page 1 is one page further, whatever the page size is;
		// bbolt looks for it the same way when page 0 is bad.
		for off := int64(minPageSize); off <= maxPageSize && off < size; off <<= 1 {
			if m, err := readMetaAt(r, size, off); err == nil && int64(m.PageSize) == off {
				pageSize = off
				break
			}
		}
		if pageSize == 0 {
			return Meta{}, damaged("both meta pages are invalid (meta 0: %v; no valid meta 1 found)", errs[0])
		}
	}
	metas[1], errs[1] = readMetaAt(r, size, pageSize)
	if errs[1] == nil && int64(metas[1].PageSize) != pageSize {
		errs[1] = fmt.Errorf("page size %d, meta 0 says %d", metas[1].PageSize, pageSize)
	}
	a, b := 0, 1
	if metas[1].TxID > metas[0].TxID {
		a, b = 1, 0
	}
	var m Meta
	switch {
	case errs[a] == nil:
		m = metas[a]
	case errs[b] == nil:
		m = metas[b]
	default:
		return Meta{}, damaged("both meta pages are invalid (meta 0: %v; meta 1: %v)", errs[0], errs[1])
	}
	switch {
	case m.HighMark < 3 || m.Root < 2 || m.Root >= m.HighMark:
		return Meta{}, damaged("meta page: root page %d outside the %d pages in use", m.Root, m.HighMark)
	case m.Freelist != noFreelist && (m.Freelist < 2 || m.Freelist >= m.HighMark):
		return Meta{}, damaged("meta page: free list page %d outside the %d pages in use", m.Freelist, m.HighMark)
	case m.HighMark > uint64(size)/uint64(m.PageSize):
		return Meta{}, damaged("the file is truncated: %d bytes, but its last transaction uses %d pages of %d bytes (%d bytes)",
			size, m.HighMark, m.PageSize, m.HighMark*uint64(m.PageSize))
	}
	return m, nil
}

func readMetaAt(r io.ReaderAt, size, off int64) (Meta, error) {
	if off+pageHeaderSize+metaSize > size {
		return Meta{}, errors.New("beyond the end of the file")
	}
	buf := make([]byte, pageHeaderSize+metaSize)
	if _, err := r.ReadAt(buf, off); err != nil {
		return Meta{}, fmt.Errorf("read: %w", err)
	}
	b := buf[pageHeaderSize:]
	sum := fnv.New64a()
	_, _ = sum.Write(b[:metaChecksumAt])
	switch {
	case order.Uint32(b[0:]) != magic:
		return Meta{}, errors.New("not a bbolt meta page (bad magic)")
	case order.Uint32(b[4:]) != version:
		return Meta{}, fmt.Errorf("format version %d, want %d", order.Uint32(b[4:]), version)
	case order.Uint64(b[metaChecksumAt:]) != sum.Sum64():
		return Meta{}, errors.New("checksum mismatch")
	}
	m := Meta{
		PageSize: order.Uint32(b[8:]),
		Root:     order.Uint64(b[16:]),
		Freelist: order.Uint64(b[32:]),
		HighMark: order.Uint64(b[40:]),
		TxID:     order.Uint64(b[48:]),
	}
	if m.PageSize < minPageSize || m.PageSize > maxPageSize || m.PageSize&(m.PageSize-1) != 0 {
		return Meta{}, fmt.Errorf("page size %d", m.PageSize)
	}
	return m, nil
}

type checker struct {
	r        io.ReaderAt
	meta     Meta
	pageSize uint64
	seen     map[uint64]bool
}

// page reads page id and the pages it overflows into, after checking that
// they are in use and referenced nowhere else.
func (c *checker) page(id uint64, want uint16) ([]byte, error) {
	if id < 2 || id >= c.meta.HighMark {
		return nil, damaged("page %d: outside the %d pages in use", id, c.meta.HighMark)
	}
	hdr := make([]byte, pageHeaderSize)
	if _, err := c.r.ReadAt(hdr, int64(id*c.pageSize)); err != nil { //nolint:gosec // id < HighMark <= size/pageSize
		return nil, fmt.Errorf("read page %d: %w", id, err)
	}
	if got := order.Uint64(hdr); got != id {
		return nil, damaged("page %d: its header says page %d", id, got)
	}
	if flags := order.Uint16(hdr[8:]); !typeOK(flags, want) {
		return nil, damaged("page %d: type %#x, want %s", id, flags, typeName(want))
	}
	overflow := uint64(order.Uint32(hdr[12:]))
	if id+overflow >= c.meta.HighMark {
		return nil, damaged("page %d: overflows %d pages, past the %d pages in use", id, overflow, c.meta.HighMark)
	}
	for i := id; i <= id+overflow; i++ {
		if c.seen[i] {
			return nil, damaged("page %d: referenced twice", i)
		}
		c.seen[i] = true
	}
	buf := make([]byte, (overflow+1)*c.pageSize)
	if _, err := c.r.ReadAt(buf, int64(id*c.pageSize)); err != nil { //nolint:gosec // as above
		return nil, fmt.Errorf("read page %d: %w", id, err)
	}
	return buf, nil
}

// typeOK reports whether a page's flags are one type that want allows.
func typeOK(flags, want uint16) bool {
	return flags&want == flags && (flags == branchFlag || flags == leafFlag || flags == freelistFlag)
}

func typeName(want uint16) string {
	switch want {
	case freelistFlag:
		return "free list"
	default:
		return "branch or leaf"
	}
}

// tree checks the subtree rooted at page id, whose keys must lie in
// [lo, hi) (nil: unbounded), and returns its largest key.
func (c *checker) tree(id uint64, lo, hi []byte) ([]byte, error) {
	p, err := c.page(id, branchFlag|leafFlag)
	if err != nil {
		return nil, err
	}
	return c.node(p, fmt.Sprintf("page %d", id), lo, hi)
}

// node checks one branch or leaf page held in p (a page read from the file
// or an inline bucket's page).
func (c *checker) node(p []byte, where string, lo, hi []byte) ([]byte, error) {
	flags, count := order.Uint16(p[8:]), int(order.Uint16(p[10:]))
	if pageHeaderSize+count*elementSize > len(p) {
		return nil, damaged("%s: %d elements do not fit in %d bytes", where, count, len(p))
	}
	prev, last := lo, []byte(nil)
	for i := range count {
		at := pageHeaderSize + i*elementSize
		e := p[at : at+elementSize]
		var pos, ksize, vsize uint64
		if flags == branchFlag {
			pos, ksize = uint64(order.Uint32(e)), uint64(order.Uint32(e[4:]))
		} else {
			pos, ksize, vsize = uint64(order.Uint32(e[4:])), uint64(order.Uint32(e[8:])), uint64(order.Uint32(e[12:]))
		}
		start := uint64(at) + pos //nolint:gosec // at >= 0
		if start+ksize+vsize > uint64(len(p)) {
			return nil, damaged("%s: element %d lies outside the page", where, i)
		}
		key := p[start : start+ksize]
		if err := checkOrder(where, i, key, prev, hi); err != nil {
			return nil, err
		}
		if flags == branchFlag {
			next := hi
			if i+1 < count {
				ne := p[pageHeaderSize+(i+1)*elementSize:]
				npos, nksize := uint64(order.Uint32(ne)), uint64(order.Uint32(ne[4:]))
				nstart := uint64(pageHeaderSize+(i+1)*elementSize) + npos //nolint:gosec // small
				if nstart+nksize > uint64(len(p)) {
					return nil, damaged("%s: element %d lies outside the page", where, i+1)
				}
				next = p[nstart : nstart+nksize]
			}
			max, err := c.tree(order.Uint64(e[8:]), key, next)
			if err != nil {
				return nil, err
			}
			prev, last = max, max
			continue
		}
		prev, last = key, key
		if order.Uint32(e)&bucketLeaf != 0 {
			if err := c.bucket(where, key, p[start+ksize:start+ksize+vsize]); err != nil {
				return nil, err
			}
		}
	}
	return last, nil
}

func checkOrder(where string, i int, key, prev, hi []byte) error {
	if prev != nil && (bytes.Compare(prev, key) > 0 || i > 0 && bytes.Equal(prev, key)) {
		return damaged("%s: key %d is out of order", where, i)
	}
	if hi != nil && bytes.Compare(key, hi) >= 0 {
		return damaged("%s: key %d is not below its parent's next key", where, i)
	}
	return nil
}

// bucket checks a nested bucket: its own tree, or its inline page.
func (c *checker) bucket(where string, name, v []byte) error {
	if len(v) < bucketHeader {
		return damaged("%s: bucket %q: value of %d bytes", where, name, len(v))
	}
	if root := order.Uint64(v); root != 0 {
		_, err := c.tree(root, nil, nil)
		return err
	}
	inline := v[bucketHeader:]
	if len(inline) < pageHeaderSize || order.Uint16(inline[8:]) != leafFlag {
		return damaged("%s: bucket %q: bad inline page", where, name)
	}
	_, err := c.node(inline, fmt.Sprintf("%s, bucket %q", where, name), nil, nil)
	return err
}

// freelist checks the persisted free list: ids in use, listed once, and
// not reachable from the tree.
func (c *checker) freelist() error {
	p, err := c.page(c.meta.Freelist, freelistFlag)
	if err != nil {
		return err
	}
	count, at := uint64(order.Uint16(p[10:])), uint64(pageHeaderSize)
	if count == 0xFFFF {
		count, at = order.Uint64(p[pageHeaderSize:]), pageHeaderSize+8
	}
	if count > (uint64(len(p))-at)/8 {
		return damaged("free list page %d: %d ids do not fit in %d bytes", c.meta.Freelist, count, len(p))
	}
	free := make(map[uint64]bool, count)
	for i := range count {
		id := order.Uint64(p[at+8*i:])
		switch {
		case id < 2 || id >= c.meta.HighMark:
			return damaged("free list: page %d outside the %d pages in use", id, c.meta.HighMark)
		case free[id]:
			return damaged("free list: page %d listed twice", id)
		case c.seen[id]:
			return damaged("free list: page %d is also in use", id)
		}
		free[id] = true
	}
	return nil
}
