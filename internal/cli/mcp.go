package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/cobra"

	"github.com/actionbus/actionbus/internal/mcpserve"
)

func mcpCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "mcp", Short: "The action catalog as an MCP server"}
	var httpAddr, user string
	var modes []string
	var timeout time.Duration
	serve := &cobra.Command{
		Use:   "serve",
		Short: "Serve the planner-visible actions as MCP tools (stdio, or streamable HTTP with --http)",
		Long: `Serve the planner-visible actions as MCP tools. Each call runs as a one-action
run through the dispatcher (policy, approvals, audit), recorded as --user's.
A call that needs an approval is told so at once (the approval id and how to
give it) and completes if the approval comes before --timeout.

Without --http it speaks MCP on stdin/stdout (logs go to stderr).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, done, err := g.client()
			if err != nil {
				return err
			}
			defer done()
			s := mcpserve.New(mcpserve.Config{Client: c, UserID: user, AllowedModes: modes, CallTimeout: timeout, Logger: g.logger()})
			ctx := cmd.Context()
			if err := s.Sync(ctx); err != nil {
				return err
			}
			go s.Run(ctx)
			if httpAddr == "" {
				return s.MCP().Run(ctx, &mcp.StdioTransport{})
			}
			ln, err := net.Listen("tcp", httpAddr)
			if err != nil {
				return err
			}
			srv := &http.Server{Handler: mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s.MCP() }, nil),
				ReadHeaderTimeout: 10 * time.Second}
			fmt.Fprintf(g.errOut, "actionbus mcp: serving MCP on http://%s\n", ln.Addr())
			stop := context.AfterFunc(ctx, func() {
				sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_ = srv.Shutdown(sctx)
			})
			defer stop()
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		},
	}
	serve.Flags().StringVar(&httpAddr, "http", "", "serve streamable HTTP on this address (host:port) instead of stdio")
	serve.Flags().StringVar(&user, "user", "mcp", "the user the calls' runs are recorded as")
	serve.Flags().StringSliceVar(&modes, "modes", []string{"read", "draft", "dryRun", "mutate"}, "modes calls may use (mutations still need an approval)")
	serve.Flags().DurationVar(&timeout, "timeout", 60*time.Second, "deadline of one call, an approval wait included")
	cmd.AddCommand(serve)
	return cmd
}
