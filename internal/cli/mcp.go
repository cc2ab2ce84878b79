package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/cobra"

	"github.com/actionbus/actionbus/internal/httpapi"
	"github.com/actionbus/actionbus/internal/mcpserve"
	"github.com/actionbus/actionbus/internal/policy"
)

func mcpCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "mcp", Short: "The action catalog as an MCP server"}
	var httpAddr, user, tokensFile, keySpec, certFile, keyFile string
	var insecure bool
	var modes []string
	var timeout time.Duration
	serve := &cobra.Command{
		Use:   "serve",
		Short: "Serve the planner-visible actions as MCP tools (stdio, or streamable HTTP with --http)",
		Long: `Serve the planner-visible actions as MCP tools. Each call runs as a one-action
run through the dispatcher (policy, approvals, audit), recorded as --user's.
A call that needs an approval is told so at once (the approval id and how to
give it) and completes if the approval comes before --timeout.

Without --http it speaks MCP on stdin/stdout (logs go to stderr), for the
one local user --user. With --http every request authenticates with a
bearer token of --tokens (the console's tokens document: read lists the
tools, run calls them) and each call's run acts for the token's user, with
the token's grants signed by the gateway key of $` + approvalKeyEnv + `
(or --approval-key; a "kid:secret:*" key of the dispatcher's). Listening
beyond loopback needs TLS (--tls-cert, --tls-key) or --insecure-http.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg := mcpserve.Config{UserID: user, AllowedModes: modes, CallTimeout: timeout, Logger: g.logger()}
			if httpAddr != "" {
				gw, err := mcpGateway(tokensFile, keySpec)
				if err != nil {
					return err
				}
				if err := checkListen(httpAddr, certFile != "", insecure); err != nil {
					return err
				}
				cfg.Gateway = gw
			}
			c, done, err := g.client()
			if err != nil {
				return err
			}
			defer done()
			cfg.Client = c
			s := mcpserve.New(cfg)
			ctx := cmd.Context()
			if err := s.Sync(ctx); err != nil {
				return err
			}
			go s.Run(ctx)
			if httpAddr == "" {
				return s.MCP().Run(ctx, &mcp.StdioTransport{})
			}
			handler, err := s.HTTPHandler()
			if err != nil {
				return err
			}
			ln, err := net.Listen("tcp", httpAddr)
			if err != nil {
				return err
			}
			srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
			scheme := "http"
			if certFile != "" {
				scheme = "https"
			}
			fmt.Fprintf(g.errOut, "actionbus mcp: serving MCP on %s://%s\n", scheme, ln.Addr())
			stop := context.AfterFunc(ctx, func() {
				sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_ = srv.Shutdown(sctx)
			})
			defer stop()
			serve := func() error { return srv.Serve(ln) }
			if certFile != "" {
				serve = func() error { return srv.ServeTLS(ln, certFile, keyFile) }
			}
			if err := serve(); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		},
	}
	serve.Flags().StringVar(&httpAddr, "http", "", "serve streamable HTTP on this address (host:port) instead of stdio")
	serve.Flags().StringVar(&user, "user", "mcp", "the user the calls' runs are recorded as (stdio; over HTTP, the token's user)")
	serve.Flags().StringVar(&tokensFile, "tokens", "", "with --http: tokens document (as the console's); required")
	serve.Flags().StringVar(&keySpec, "approval-key", "", "with --http: gateway key kid:base64secret that signs each call's user and grants (default: $"+approvalKeyEnv+")")
	serve.Flags().StringVar(&certFile, "tls-cert", "", "with --http: TLS certificate file")
	serve.Flags().StringVar(&keyFile, "tls-key", "", "with --http: TLS key file")
	serve.Flags().BoolVar(&insecure, "insecure-http", false, "with --http: allow plain HTTP on a non-loopback address")
	serve.Flags().StringSliceVar(&modes, "modes", []string{"read", "draft", "dryRun", "mutate"}, "modes calls may use (mutations still need an approval)")
	serve.Flags().DurationVar(&timeout, "timeout", 60*time.Second, "deadline of one call, an approval wait included")
	cmd.AddCommand(serve)
	return cmd
}

// mcpGateway reads the tokens document and the gateway key that
// authenticate mcp serve's HTTP callers.
func mcpGateway(tokensFile, keySpec string) (*mcpserve.Gateway, error) {
	if tokensFile == "" {
		return nil, errors.New("mcp serve: --http needs --tokens FILE: every HTTP caller authenticates (make a token with: actionbus console token --user NAME)")
	}
	data, err := os.ReadFile(tokensFile)
	if err != nil {
		return nil, err
	}
	tokens, err := httpapi.ParseTokens(data)
	if err != nil {
		return nil, err
	}
	gw := &mcpserve.Gateway{Tokens: tokens}
	if keySpec == "" {
		keySpec = os.Getenv(approvalKeyEnv)
	}
	if keySpec != "" {
		keys, err := policy.ParseKeys(keySpec)
		if err != nil {
			return nil, err
		}
		if len(keys) != 1 {
			return nil, errors.New("mcp serve: --approval-key takes one gateway key (kid:base64secret)")
		}
		for kid, key := range keys {
			gw.KeyID, gw.Key = kid, key.Secret
		}
	}
	return gw, nil
}
