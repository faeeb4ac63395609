package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"go.yaml.in/yaml/v3"
)

// Document is one object of a policy file, as JSON, with where it sits in
// the file so that an error can name it.
type Document struct {
	// Index is the document's 1-based position in the stream.
	Index int
	// Item is the 1-based position inside a document that is a list of
	// objects, or 0 for a document that is one object.
	Item int
	// JSON is the document re-encoded as JSON. A value that is not an
	// object is kept as it is, for the caller to refuse by position.
	JSON json.RawMessage
}

// Pos names the document for messages: "document 2", or "document 1,
// item 3" inside a list.
func (d Document) Pos() string {
	if d.Item > 0 {
		return fmt.Sprintf("document %d, item %d", d.Index, d.Item)
	}
	return fmt.Sprintf("document %d", d.Index)
}

// DocumentError is a stream that does not parse, at the document that
// broke it.
type DocumentError struct {
	Index int // 1-based, as Document.Index
	Err   error
}

// Error renders "document N: reason".
func (e *DocumentError) Error() string { return fmt.Sprintf("document %d: %v", e.Index, e.Err) }

// Unwrap returns the parser's error.
func (e *DocumentError) Unwrap() error { return e.Err }

// Documents parses what `policyd policy apply -f` and a Git source read: a
// YAML stream (documents separated by ---) or JSON values one after another,
// each one object or a list of objects. Empty documents hold nothing and are
// skipped; an input with none gives no documents and no error. A stream
// that does not parse is refused whole, with a *DocumentError.
func Documents(raw []byte) ([]Document, error) {
	var values []any
	var err error
	if t := bytes.TrimSpace(raw); len(t) > 0 && (t[0] == '{' || t[0] == '[') {
		values, err = jsonStream(t)
	} else {
		values, err = yamlStream(raw)
	}
	if err != nil {
		return nil, err
	}
	var docs []Document
	for i, v := range values {
		switch v := v.(type) {
		case nil:
			// An empty document (a stray ---) holds nothing to apply.
		case []any:
			for j, it := range v {
				docs = append(docs, toDocument(i+1, j+1, it))
			}
		default:
			docs = append(docs, toDocument(i+1, 0, v))
		}
	}
	return docs, nil
}

// toDocument encodes one parsed value as JSON; a value that is not an
// object still becomes a document, which the caller reports by position.
func toDocument(index, item int, v any) Document {
	b, err := json.Marshal(v)
	if err != nil {
		b, _ = json.Marshal(fmt.Sprintf("unencodable: %v", err))
	}
	return Document{Index: index, Item: item, JSON: b}
}

func jsonStream(raw []byte) ([]any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var out []any
	for n := 1; ; n++ {
		var v any
		if err := dec.Decode(&v); errors.Is(err, io.EOF) {
			return out, nil
		} else if err != nil {
			return nil, &DocumentError{Index: n, Err: fmt.Errorf("not valid JSON: %w", err)}
		}
		out = append(out, v)
	}
}

func yamlStream(raw []byte) ([]any, error) {
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	var out []any
	for n := 1; ; n++ {
		var v any
		if err := dec.Decode(&v); errors.Is(err, io.EOF) {
			return out, nil
		} else if err != nil {
			return nil, &DocumentError{Index: n, Err: fmt.Errorf("not valid YAML: %w", err)}
		}
		v, err := jsonCompatible(v)
		if err != nil {
			return nil, &DocumentError{Index: n, Err: err}
		}
		out = append(out, v)
	}
}

// jsonCompatible checks that a YAML value has only string keys, which JSON
// needs (yaml.v3 decodes other keys as such).
func jsonCompatible(v any) (any, error) {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			e, err := jsonCompatible(e)
			if err != nil {
				return nil, err
			}
			v[k] = e
		}
	case map[any]any:
		return nil, errors.New("a mapping key is not a string")
	case []any:
		for i, e := range v {
			e, err := jsonCompatible(e)
			if err != nil {
				return nil, err
			}
			v[i] = e
		}
	}
	return v, nil
}
