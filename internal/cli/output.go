package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/policyd/policyd/internal/config"
)

// Output formats of -o. "" is the default: a table for lists and status,
// the JSON document for a single resource (get).
const (
	outputTable = "table"
	outputJSON  = "json"
	outputYAML  = "yaml"
)

// checkOutput refuses an -o value no command prints.
func checkOutput(o string) error {
	switch o {
	case "", outputTable, outputJSON, outputYAML:
		return nil
	}
	return &usageError{fmt.Errorf("-o %q: want table, json or yaml", o)}
}

// printValue writes v as JSON or YAML per format, or calls table (which may
// be nil for values printed as JSON by default).
func printValue(w io.Writer, format string, v any, table func(io.Writer) error) error {
	switch {
	case format == outputYAML:
		b, err := yaml.Marshal(v)
		if err != nil {
			return fmt.Errorf("encode YAML: %w", err)
		}
		_, err = w.Write(b)
		return err
	case format == outputJSON, table == nil:
		return printJSON(w, v)
	}
	return table(w)
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// newTable is the tab writer every table uses.
func newTable(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 4, 2, ' ', 0) }

// outputOf is the -o flag (the root's persistent flag) as cmd parsed it,
// checked; the offline commands, which have no API client, read it here.
func outputOf(cmd *cobra.Command) (string, error) {
	o, err := cmd.Flags().GetString("output")
	if err != nil {
		return "", nil // a command tree without -o: the default
	}
	return o, checkOutput(o)
}

// peerList is servers as the offline commands print them.
func peerList(servers []config.Peer) []map[string]string {
	out := make([]map[string]string, len(servers))
	for i, s := range servers {
		out[i] = map[string]string{"id": s.ID, "address": s.Address}
	}
	return out
}

// short abbreviates a policy-set version (a SHA-256) for tables.
func short(v string) string {
	if len(v) > 12 {
		return v[:12]
	}
	return v
}

func printUnreachable(w io.Writer, nodes []string) error {
	if len(nodes) == 0 {
		return nil
	}
	_, err := fmt.Fprintf(w, "unreachable nodes (their clients are missing): %s\n", strings.Join(nodes, ", "))
	return err
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
