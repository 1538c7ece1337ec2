package main

import (
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	adminv1 "github.com/agentconnect-md/agentconnect/api/admin/v1"
)

func newEventsCommand(g *globals) *cobra.Command {
	var follow, asJSON bool
	cmd := &cobra.Command{
		Use:   "events",
		Short: "Print what happened on the daemon (sessions and agents)",
		Long: `Print the daemon's recent events (the last 1000: sessions started, exited,
lost, adopted after a restart, removed; agents created, changed, removed), and
with --follow the ones that come next. --json prints one JSON object a line.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer c.Close()
			stream, err := c.admin.Events(cmd.Context(), &adminv1.EventsRequest{Follow: follow})
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			for {
				e, err := stream.Recv()
				if errors.Is(err, io.EOF) {
					return nil
				}
				if err != nil {
					return err
				}
				if asJSON {
					printJSONLine(w, eventView(e))
					continue
				}
				fmt.Fprintf(w, "%s  %-16s %s %s %s\n", timeString(e.Time), e.Type, e.SessionId, e.Agent, e.Message)
			}
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing new events")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON, one object a line")
	return cmd
}
