package main

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"

	"sigs.k8s.io/yaml"
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
