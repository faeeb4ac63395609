package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
)

// figure is one measured result. It is printed as one JSON line (so its
// type must marshal to a JSON object that includes a "scenario" field) and
// as one row of the summary table.
type figure interface {
	// columns names the table columns; figures with the same columns share
	// one table.
	columns() []string
	// row is the figure's table row, one cell per column.
	row() []string
}

// reporter prints figures as JSON lines to stdout and, with -out, to a file,
// and keeps them for the summary table.
type reporter struct {
	stdout  io.Writer
	file    *os.File
	figures []figure
}

// newReporter writes to stdout and, unless outPath is empty, to outPath
// (created or truncated).
func newReporter(stdout io.Writer, outPath string) (*reporter, error) {
	r := &reporter{stdout: stdout}
	if outPath != "" {
		f, err := os.Create(outPath)
		if err != nil {
			return nil, fmt.Errorf("-out: %w", err)
		}
		r.file = f
	}
	return r, nil
}

// emit prints f as one JSON line at once, so a figure is not lost if a
// later part of the run fails.
func (r *reporter) emit(f figure) error {
	line, err := json.Marshal(f)
	if err != nil {
		return fmt.Errorf("encode figure: %w", err)
	}
	line = append(line, '\n')
	r.figures = append(r.figures, f)
	if _, err := r.stdout.Write(line); err != nil {
		return fmt.Errorf("write figure: %w", err)
	}
	if r.file != nil {
		if _, err := r.file.Write(line); err != nil {
			return fmt.Errorf("write figure to %s: %w", r.file.Name(), err)
		}
	}
	return nil
}

// printSummary writes the figures as aligned tables, one per column set.
func (r *reporter) printSummary(w io.Writer) {
	if len(r.figures) == 0 {
		return
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "summary:")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	header := ""
	for _, f := range r.figures {
		if h := strings.Join(f.columns(), "\t"); h != header {
			if header != "" {
				fmt.Fprintln(tw)
			}
			header = h
			fmt.Fprintln(tw, h+"\t")
		}
		fmt.Fprintln(tw, strings.Join(f.row(), "\t")+"\t")
	}
	_ = tw.Flush()
}

// close closes the -out file.
func (r *reporter) close() error {
	if r.file == nil {
		return nil
	}
	if err := r.file.Close(); err != nil {
		return fmt.Errorf("close %s: %w", r.file.Name(), err)
	}
	return nil
}
