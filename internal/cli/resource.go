package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/policyd/policyd/adminclient"
	"github.com/policyd/policyd/internal/policy"
)

// resource describes policies or employees for the shared commands.
type resource struct {
	noun, plural, key string
	listFlags         []string
	list              func(api *adminclient.Client, ctx context.Context, filters map[string]string, consistent bool) (any, func(io.Writer) error, error)
	get               func(api *adminclient.Client, ctx context.Context, key string) (any, error)
	put               func(api *adminclient.Client, ctx context.Context, key string, doc json.RawMessage, ifMatch int64) (*adminclient.Written, error)
	del               func(api *adminclient.Client, ctx context.Context, key string, ifMatch int64) (*adminclient.Deleted, error)
}

// resourceCommand builds list/get/apply/delete for one resource; the
// resource's own command adds the rest (history, shadow).
func resourceCommand(c *adminClient, r resource) *cobra.Command {
	root := groupCommand(r.noun, "Manage "+r.plural)

	var consistent bool
	filters := map[string]*string{}
	list := &cobra.Command{
		Use: "list", Short: "List " + r.plural, Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			api, err := c.client()
			if err != nil {
				return err
			}
			f := map[string]string{}
			for k, v := range filters {
				f[k] = *v
			}
			out, table, err := r.list(api, cmd.Context(), f, consistent)
			if err != nil {
				return err
			}
			return c.print(cmd, out, table)
		},
	}
	for _, f := range r.listFlags {
		filters[f] = list.Flags().String(f, "", "filter by "+f)
	}
	list.Flags().BoolVar(&consistent, "consistent", false, "linearizable read through the leader")

	get := &cobra.Command{
		Use: "get " + strings.ToUpper(r.key), Short: "Show one " + r.noun + " (JSON unless -o yaml)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			api, err := c.client()
			if err != nil {
				return err
			}
			out, err := r.get(api, cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return c.print(cmd, out, nil)
		},
	}

	var file string
	var applyRev int64
	apply := &cobra.Command{
		Use:   "apply -f FILE",
		Short: "Create or replace " + r.plural + " from a JSON or YAML file (- for stdin)",
		Long: `apply writes every document of FILE: a YAML stream (documents separated by
---), JSON values one after another, or a list of objects in one document.
The whole file is read and parsed before anything is written: a malformed
stream writes nothing. Then each document is applied in order; one that fails
is reported as "document N: error" and the others are still applied.

Exit codes: 0 every document applied, 1 some failed (or the file is
malformed), 2 usage.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if file == "" {
				return &usageError{errors.New("apply needs -f FILE")}
			}
			api, err := c.client()
			if err != nil {
				return err
			}
			docs, err := readDocuments(file)
			if err != nil {
				return err
			}
			return applyDocuments(cmd, c, api, r, docs, applyRev)
		},
	}
	apply.Flags().StringVarP(&file, "filename", "f", "", "file to apply (JSON or YAML; several documents, or a list)")
	apply.Flags().Int64Var(&applyRev, "if-match", -1, "only apply if the current revision is this (0: only create)")

	var delRev int64
	del := &cobra.Command{
		Use: "delete " + strings.ToUpper(r.key), Short: "Delete a " + r.noun, Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			api, err := c.client()
			if err != nil {
				return err
			}
			out, err := r.del(api, cmd.Context(), args[0], delRev)
			if err != nil {
				return err
			}
			return c.print(cmd, out, func(w io.Writer) error {
				_, err := fmt.Fprintf(w, "%s/%s deleted (revision %d)\n", r.noun, args[0], out.Revision)
				return err
			})
		},
	}
	del.Flags().Int64Var(&delRev, "if-match", -1, "only delete if the current revision is this")

	root.AddCommand(list, get, apply, del)
	return root
}

// applyResult is one document's outcome, as -o json/yaml prints it.
type applyResult struct {
	Document string `json:"document"`
	Key      string `json:"key,omitempty"`
	Revision uint64 `json:"revision,omitempty"`
	Error    string `json:"error,omitempty"`
}

// applyDocuments writes each document, reports each failure by position on
// stderr, and fails (exit 1) if any did.
func applyDocuments(cmd *cobra.Command, c *adminClient, api *adminclient.Client, r resource, docs []document, ifMatch int64) error {
	results := make([]applyResult, 0, len(docs))
	failed := 0
	for _, d := range docs {
		res := applyResult{Document: d.pos}
		key, err := nameOf(d.json, r.key)
		if err == nil {
			res.Key = key
			var w *adminclient.Written
			if w, err = r.put(api, cmd.Context(), key, d.json, ifMatch); err == nil {
				res.Revision = w.Revision
			} else {
				err = fmt.Errorf("%s/%s: %w", r.noun, key, err)
			}
		}
		if err != nil {
			var ue *adminclient.UnreachableError
			if errors.As(err, &ue) {
				// No server answers: the rest would only repeat it.
				return fmt.Errorf("%s: %w (it and the documents after it were not applied)", d.pos, err)
			}
			failed++
			res.Error = err.Error()
			fmt.Fprintf(cmd.ErrOrStderr(), "%s: %v\n", d.pos, err)
		} else if c.output == "" || c.output == outputTable {
			fmt.Fprintf(cmd.OutOrStdout(), "%s/%s applied (revision %d)\n", r.noun, key, res.Revision)
		}
		results = append(results, res)
	}
	if c.output == outputJSON || c.output == outputYAML {
		if err := c.print(cmd, results, nil); err != nil {
			return err
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d documents failed", failed, len(docs))
	}
	return nil
}

// document is one object of an apply file, as JSON, with its position
// ("document 2", or "document 1, item 3" inside a list).
type document struct {
	pos  string
	json json.RawMessage
}

// readDocuments reads a JSON or YAML file (or - for stdin): a stream of
// documents, each one object or a list of objects. A stream that does not
// parse is refused whole, naming the document that broke it.
func readDocuments(path string) ([]document, error) {
	var raw []byte
	var err error
	if path == "-" {
		raw, err = io.ReadAll(os.Stdin)
	} else {
		raw, err = os.ReadFile(path)
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	parsed, err := policy.Documents(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w (nothing was applied)", path, err)
	}
	if len(parsed) == 0 {
		return nil, fmt.Errorf("%s: no document to apply", path)
	}
	docs := make([]document, len(parsed))
	for i, d := range parsed {
		docs[i] = document{pos: d.Pos(), json: d.JSON}
	}
	return docs, nil
}

// nameOf extracts a document's key field without validating the rest (the
// server does that).
func nameOf(doc []byte, field string) (string, error) {
	var m map[string]any
	if err := json.Unmarshal(doc, &m); err != nil {
		return "", errors.New("document is not an object")
	}
	s, _ := m[field].(string)
	if s == "" {
		return "", fmt.Errorf("document has no %q", field)
	}
	return s, nil
}
