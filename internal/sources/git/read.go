package git

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"sort"
	"strings"
	"unicode/utf8"

	gogit "github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/object"

	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/sources"
)

// Limits on what one commit may hold under path. Past them the file, or the
// whole commit, is refused rather than read.
const (
	MaxFileSize = 1 << 20
	MaxFiles    = 10000
	// maxSymlinkHops bounds a chain of symlinks, which also ends a cycle.
	maxSymlinkHops = 8
	// maxSymlinkTarget bounds what a symlink blob may hold.
	maxSymlinkTarget = 4096
)

// isDocument reports whether name is a file the source reads.
func isDocument(name string) bool {
	switch path.Ext(name) {
	case ".yaml", ".yml", ".json":
		return true
	}
	return false
}

// hidden reports whether a path under Path has a component starting with
// a dot (.github/, .gitlab-ci.yml): tooling files, never policies.
func hidden(rel string) bool {
	for part := range strings.SplitSeq(rel, "/") {
		if strings.HasPrefix(part, ".") {
			return true
		}
	}
	return false
}

// entry is one file of the commit under Path.
type entry struct {
	name string // from the repository's root
	te   object.TreeEntry
}

// read turns the documents of commit under Path into an observation. An
// error means the local object store could not be read.
func (d *Driver) read(commit *object.Commit) (*sources.Observation, error) {
	obs := &sources.Observation{Revision: commit.Hash.String(), Complete: true, Atomic: true}
	root, err := commit.Tree()
	if err != nil {
		return nil, fmt.Errorf("tree: %w", err)
	}
	base := root
	if d.cfg.Path != "" {
		te, err := root.FindEntry(d.cfg.Path)
		if err != nil || te.Mode != filemode.Dir {
			obs.Invalid = append(obs.Invalid, sources.ObjectError{
				Object:  d.cfg.Path,
				Message: fmt.Sprintf("path %s is not a directory in commit %s: nothing is read (is path right?)", d.cfg.Path, short(commit.Hash)),
			})
			return obs, nil
		}
		if base, err = root.Tree(d.cfg.Path); err != nil {
			return nil, fmt.Errorf("tree %s: %w", d.cfg.Path, err)
		}
	}
	files, err := d.list(base)
	if err != nil {
		return nil, err
	}
	if len(files) > MaxFiles {
		obs.Invalid = append(obs.Invalid, sources.ObjectError{
			Object:  d.pathName(),
			Message: fmt.Sprintf("more than %d files under %s: the commit is refused", MaxFiles, d.pathName()),
		})
		return obs, nil
	}
	decoded := make(map[string]decodedFile, len(files))
	declared := map[string]string{} // policy name → object declaring it
	for _, f := range files {
		res, err := d.readFile(root, f, decoded)
		if err != nil {
			return nil, err
		}
		obs.Invalid = append(obs.Invalid, res.invalid...)
		for _, decl := range res.policies {
			if first, ok := declared[decl.Policy.Name]; ok {
				obs.Invalid = append(obs.Invalid, sources.ObjectError{
					Object: decl.Object, Name: decl.Policy.Name, Field: "name",
					Message: fmt.Sprintf("policy %s is also declared by %s", decl.Policy.Name, first),
				})
				continue
			}
			declared[decl.Policy.Name] = decl.Object
			obs.Policies = append(obs.Policies, decl)
		}
	}
	d.decoded = decoded
	return obs, nil
}

// decodedFile is what one file at one blob declares, kept so that a commit
// that changes one file decodes only that file.
type decodedFile struct {
	blob     plumbing.Hash
	policies []sources.Declared
	invalid  []sources.ObjectError
}

// pathName is Path for messages: "/" for the repository's root.
func (d *Driver) pathName() string {
	if d.cfg.Path == "" {
		return "/"
	}
	return d.cfg.Path
}

// list returns the files under base in name order, stopping once there are
// more than MaxFiles.
func (d *Driver) list(base *object.Tree) ([]entry, error) {
	w := object.NewTreeWalker(base, true, nil)
	defer w.Close()
	var files []entry
	for len(files) <= MaxFiles {
		name, te, err := w.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("walk tree: %w", err)
		}
		if te.Mode == filemode.Dir || te.Mode == filemode.Submodule {
			continue
		}
		files = append(files, entry{name: path.Join(d.cfg.Path, name), te: te})
	}
	sort.Slice(files, func(i, j int) bool { return files[i].name < files[j].name })
	return files, nil
}

// readFile returns what one file declares, or what is wrong with it; the
// decoding of a blob read before under the same name is reused, and every
// file read goes into decoded.
func (d *Driver) readFile(root *object.Tree, f entry, decoded map[string]decodedFile) (decodedFile, error) {
	rel := strings.TrimPrefix(strings.TrimPrefix(f.name, d.cfg.Path), "/")
	if hidden(rel) {
		return decodedFile{}, nil
	}
	refuse := func(format string, args ...any) decodedFile {
		return decodedFile{invalid: []sources.ObjectError{{Object: f.name, Message: fmt.Sprintf(format, args...)}}}
	}
	te := f.te
	if te.Mode == filemode.Symlink {
		target, problem, err := d.follow(root, f.name, te, isDocument(f.name))
		if err != nil {
			return decodedFile{}, err
		}
		if problem != "" {
			return refuse("%s", problem), nil
		}
		te = target
	}
	if !isDocument(f.name) {
		return decodedFile{}, nil
	}
	if prev, ok := d.decoded[f.name]; ok && prev.blob == te.Hash {
		decoded[f.name] = prev
		return prev, nil
	}
	res, err := d.decodeBlob(f.name, te.Hash)
	if err != nil {
		return decodedFile{}, err
	}
	res.blob = te.Hash
	decoded[f.name] = res
	return res, nil
}

// decodeBlob decodes the documents of the file name, whose content is h.
func (d *Driver) decodeBlob(name string, h plumbing.Hash) (decodedFile, error) {
	var res decodedFile
	refuse := func(format string, args ...any) (decodedFile, error) {
		res.invalid = append(res.invalid, sources.ObjectError{Object: name, Message: fmt.Sprintf(format, args...)})
		return res, nil
	}
	blob, err := d.repo.BlobObject(h)
	if err != nil {
		return res, fmt.Errorf("blob of %s: %w", name, err)
	}
	if blob.Size > MaxFileSize {
		return refuse("file is %d bytes, over the limit of %d (1 MiB): refused", blob.Size, MaxFileSize)
	}
	raw, err := readBlob(d.repo, h, MaxFileSize)
	if err != nil {
		return res, fmt.Errorf("read %s: %w", name, err)
	}
	if i := bytes.IndexByte(raw, 0); i >= 0 {
		return refuse("binary file (a NUL byte at offset %d): refused", i)
	}
	if !utf8.Valid(raw) {
		return refuse("invalid UTF-8 at offset %d: refused", invalidUTF8(raw))
	}
	docs, err := policy.Documents(raw)
	if err != nil {
		var de *policy.DocumentError
		if errors.As(err, &de) {
			res.invalid = append(res.invalid, sources.ObjectError{Object: fmt.Sprintf("%s#%d", name, de.Index), Message: de.Err.Error()})
			return res, nil
		}
		return refuse("%v", err)
	}
	for _, doc := range docs {
		object := fmt.Sprintf("%s#%d", name, doc.Index)
		if doc.Item > 0 {
			object = fmt.Sprintf("%s#%d.%d", name, doc.Index, doc.Item)
		}
		decl, errs := declare(object, doc.JSON)
		if len(errs) > 0 {
			res.invalid = append(res.invalid, errs...)
			continue
		}
		res.policies = append(res.policies, decl)
	}
	return res, nil
}

// declare decodes one document as the REST API decodes a policy, after
// taking out its adopt field.
func declare(object string, doc json.RawMessage) (sources.Declared, []sources.ObjectError) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(doc, &m); err != nil || m == nil {
		return sources.Declared{}, []sources.ObjectError{{Object: object, Message: "document is not an object"}}
	}
	var name string
	_ = json.Unmarshal(m["name"], &name)
	decl := sources.Declared{Object: object}
	if raw, ok := m["adopt"]; ok {
		if err := json.Unmarshal(raw, &decl.Adopt); err != nil {
			return sources.Declared{}, []sources.ObjectError{{Object: object, Name: name, Field: "adopt", Message: "expected boolean, got " + string(raw)}}
		}
		delete(m, "adopt")
		b, err := json.Marshal(m)
		if err != nil {
			return sources.Declared{}, []sources.ObjectError{{Object: object, Name: name, Message: err.Error()}}
		}
		doc = b
	}
	p, err := policy.DecodePolicy(doc)
	if err != nil {
		var ve policy.ValidationError
		if !errors.As(err, &ve) || len(ve) == 0 {
			return sources.Declared{}, []sources.ObjectError{{Object: object, Name: name, Message: err.Error()}}
		}
		errs := make([]sources.ObjectError, len(ve))
		for i, fe := range ve {
			errs[i] = sources.ObjectError{Object: object, Name: name, Field: fe.Field, Message: fe.Reason}
		}
		return sources.Declared{}, errs
	}
	decl.Policy = p
	return decl, nil
}

// follow resolves the symlink at name. A link that leaves the repository
// (absolute, or above its root) is a problem wherever it is; the others are
// followed only for documents, to a file of the same commit, through at
// most maxSymlinkHops links.
func (d *Driver) follow(root *object.Tree, name string, te object.TreeEntry, document bool) (object.TreeEntry, string, error) {
	cur := name
	for hop := 0; te.Mode == filemode.Symlink; hop++ {
		if hop == maxSymlinkHops {
			return te, fmt.Sprintf("symlink chain longer than %d links: refused", maxSymlinkHops), nil
		}
		raw, err := readBlob(d.repo, te.Hash, maxSymlinkTarget)
		if err != nil {
			return te, "", fmt.Errorf("read symlink %s: %w", cur, err)
		}
		target := string(raw)
		next := path.Join(path.Dir(cur), target)
		if path.IsAbs(target) || next == ".." || strings.HasPrefix(next, "../") {
			return te, fmt.Sprintf("symlink to %s leaves the repository: refused", target), nil
		}
		if !document {
			return te, "", nil
		}
		found, err := root.FindEntry(next)
		if err != nil {
			return te, fmt.Sprintf("symlink to %s: no such file in the commit", target), nil
		}
		if found.Mode == filemode.Dir || found.Mode == filemode.Submodule {
			return te, fmt.Sprintf("symlink to %s, which is not a file: refused", target), nil
		}
		cur, te = next, *found
	}
	return te, "", nil
}

// readBlob reads at most limit bytes of a blob.
func readBlob(repo *gogit.Repository, h plumbing.Hash, limit int64) ([]byte, error) {
	blob, err := repo.BlobObject(h)
	if err != nil {
		return nil, err
	}
	r, err := blob.Reader()
	if err != nil {
		return nil, err
	}
	defer func() { _ = r.Close() }()
	return io.ReadAll(io.LimitReader(r, limit))
}

// invalidUTF8 is the offset of the first byte that is not valid UTF-8.
func invalidUTF8(b []byte) int {
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n == 1 {
			return i
		}
		i += n
	}
	return len(b)
}
