package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/policyd/policyd/adminclient"
)

// eventsCommand reads the event log.
func eventsCommand(c *adminClient) *cobra.Command {
	root := groupCommand("events", "Read the event log")
	var f adminclient.EventFilter
	list := &cobra.Command{
		Use: "list", Short: "List events", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			api, err := c.client()
			if err != nil {
				return err
			}
			page, err := api.Events(cmd.Context(), f)
			if err != nil {
				return err
			}
			return c.print(cmd, page, func(w io.Writer) error {
				tw := newTable(w)
				fmt.Fprintln(tw, "ID\tTYPE\tORG\tACTION\tENTITY\tACTOR\tPROCESSED")
				for _, e := range page.Events {
					fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", e.ID, e.EntityType, e.Org, e.Action, e.EntityID, orDash(e.Actor), e.ProcessedAt.Format(time.RFC3339))
				}
				return tw.Flush()
			})
		},
	}
	list.Flags().IntVar(&f.Limit, "limit", 100, "at most this many events")
	watch := &cobra.Command{
		Use: "watch", Short: "Stream events as they are applied (one JSON line each; -o yaml: one YAML document each)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			api, err := c.client()
			if err != nil {
				return err
			}
			body, err := api.WatchEvents(cmd.Context(), f)
			if err != nil {
				return err
			}
			defer body.Close()
			return copySSE(cmd.Context(), body, cmd.OutOrStdout(), c.output)
		},
	}
	for _, cmd := range []*cobra.Command{list, watch} {
		cmd.Flags().StringVar(&f.Type, "type", "", "entity type: policy, employee, drift, reload")
		cmd.Flags().StringVar(&f.Org, "org", "", "only this org")
		cmd.Flags().StringVar(&f.Actor, "actor", "", "only changes made by this actor (token:NAME, cert:SUBJECT, task:NAME)")
		cmd.Flags().Uint64Var(&f.After, "after", 0, "only events after this id")
	}
	root.AddCommand(list, watch)
	return root
}

// copySSE prints each event's data line; a reset is printed as a JSON object
// with "reset". It returns nil when ctx ends (Ctrl-C).
func copySSE(ctx context.Context, r io.Reader, w io.Writer, format string) error {
	err := adminclient.ReadEvents(r, func(ev adminclient.StreamEvent) error {
		data := ev.Data
		if ev.Event == "reset" {
			data = "{\"reset\":" + data + "}"
		}
		if format != outputYAML {
			_, err := fmt.Fprintln(w, data)
			return err
		}
		var v any
		if err := json.Unmarshal([]byte(data), &v); err != nil {
			return fmt.Errorf("event stream: %w", err)
		}
		if _, err := fmt.Fprintln(w, "---"); err != nil {
			return err
		}
		return printValue(w, outputYAML, v, nil)
	})
	switch {
	case ctx.Err() != nil:
		return nil
	case errors.Is(err, io.EOF):
		return errors.New("event stream ended by the server")
	}
	return err
}
