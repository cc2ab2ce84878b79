package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/internal/console"
	"github.com/actionbus/actionbus/internal/httpapi"
	"github.com/actionbus/actionbus/internal/policy"
	"github.com/actionbus/actionbus/internal/service"
)

// consoleServer is the HTTP API with the console page, listening.
type consoleServer struct {
	api     *httpapi.Server
	ln      net.Listener
	srv     *http.Server
	done    chan struct{} // the HTTP server returned
	watched chan struct{} // the API's watch of the runs returned
	cancel  context.CancelFunc
	once    sync.Once
	tls     bool
}

// URL is the console's address.
func (c *consoleServer) URL() string {
	scheme := "http"
	if c.tls {
		scheme = "https"
	}
	return scheme + "://" + c.ln.Addr().String() + "/"
}

// startConsole listens on addr and serves the API and the console until
// ctx ends; certFile and keyFile, when set, serve TLS.
func startConsole(ctx context.Context, g *globals, cfg httpapi.Config, addr, certFile, keyFile string) (*consoleServer, error) {
	cfg.Logger = g.logger()
	api, err := httpapi.New(cfg)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("console: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	c := &consoleServer{api: api, ln: ln, done: make(chan struct{}), watched: make(chan struct{}), cancel: cancel, tls: certFile != ""}
	c.srv = &http.Server{Handler: console.Mount(api.Handler(), console.Options{Tenant: api.Tenant()}), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		defer close(c.watched)
		_ = api.Run(ctx)
	}()
	go func() {
		defer close(c.done)
		var err error
		if c.tls {
			err = c.srv.ServeTLS(ln, certFile, keyFile)
		} else {
			err = c.srv.Serve(ln)
		}
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintln(g.errOut, "actionbus: console:", err)
		}
	}()
	context.AfterFunc(ctx, c.stop)
	return c, nil
}

// stop ends the server (followers' streams are cut) and its watch of the
// runs, and returns once both have: call it before the NATS connection
// closes.
func (c *consoleServer) stop() {
	c.once.Do(func() {
		c.cancel()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if c.srv.Shutdown(sctx) != nil {
			_ = c.srv.Close()
		}
		<-c.done
		<-c.watched
	})
}

func consoleCmd(g *globals) *cobra.Command {
	var listen, tokensFile, approverURL, keySpec, certFile, keyFile string
	var insecure bool
	cmd := &cobra.Command{
		Use:   "console",
		Short: "Serve the web console and the HTTP API (docs/http.md) for one tenant",
		Long: `console serves the web console at / and the HTTP API under /v1/ for the
tenant of --tenant. It connects to NATS as that tenant's client user (--nats)
and, for approvals, as its approver user (--approver-nats; default: the same
connection), so NATS enforces the trust rules for every request. Callers
authenticate with bearer tokens listed in --tokens (make one with
"actionbus console token"); approve signs grants with the key of
$` + approvalKeyEnv + ` (or --approval-key).

Listening on an address other than loopback needs TLS (--tls-cert, --tls-key)
or --insecure-http: bearer tokens must not cross a network in the clear.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if tokensFile == "" {
				return errors.New("console: --tokens FILE is required (make a token with: actionbus console token --user NAME)")
			}
			data, err := os.ReadFile(tokensFile)
			if err != nil {
				return err
			}
			tokens, err := httpapi.ParseTokens(data)
			if err != nil {
				return err
			}
			if err := checkListen(listen, certFile != "", insecure); err != nil {
				return err
			}
			c, done, err := g.client()
			if err != nil {
				return err
			}
			defer done()
			cfg := httpapi.Config{Client: c, Approver: c, Tokens: tokens}
			if approverURL != "" {
				nc, err := nats.Connect(approverURL, nats.Name("actionbus-console-approver"), nats.CustomInboxPrefix(client.InboxPrefix(g.tenant)))
				if err != nil {
					return fmt.Errorf("connect to %s: %w", service.RedactURL(approverURL), err)
				}
				defer nc.Close()
				if cfg.Approver, err = client.New(nc, client.Options{Prefix: g.prefix, Source: "/actionbus/console", Tenant: g.tenant}); err != nil {
					return err
				}
			}
			if keySpec == "" {
				keySpec = os.Getenv(approvalKeyEnv)
			}
			if keySpec != "" {
				keys, err := policy.ParseKeys(keySpec)
				if err != nil {
					return err
				}
				if len(keys) != 1 {
					return fmt.Errorf("console: approvals need exactly one key (kid:base64secret, a gateway's key: kid:base64secret:* among the dispatcher's keys)")
				}
				for kid, key := range keys {
					cfg.ApprovalKeyID, cfg.ApprovalKey = kid, key.Secret
				}
			}
			ctx := cmd.Context()
			srv, err := startConsole(ctx, g, cfg, listen, certFile, keyFile)
			if err != nil {
				return err
			}
			fmt.Fprintf(g.out, "actionbus console: %s (tenant %s; API under %sv1/)\n", srv.URL(), c.Tenant(), srv.URL())
			<-ctx.Done()
			srv.stop()
			return nil
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:8642", "address to serve on")
	cmd.Flags().StringVar(&tokensFile, "tokens", "", "tokens document: {\"tokens\": [{\"sha256\", \"user\", \"roles\", \"grants\"}]}")
	cmd.Flags().StringVar(&approverURL, "approver-nats", "", "NATS URL of the tenant's approver user (default: the --nats connection)")
	cmd.Flags().StringVar(&keySpec, "approval-key", "", "approval key kid:base64secret (default: $"+approvalKeyEnv+"; without one, approve is refused)")
	cmd.Flags().StringVar(&certFile, "tls-cert", "", "TLS certificate file")
	cmd.Flags().StringVar(&keyFile, "tls-key", "", "TLS key file")
	cmd.Flags().BoolVar(&insecure, "insecure-http", false, "allow plain HTTP on a non-loopback address")

	var user string
	var roles, grantRoles, grantScopes []string
	token := &cobra.Command{
		Use:   "token",
		Short: "Make a bearer token: prints the token (give it to the caller) and its tokens-document entry (keep it in --tokens)",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			tok, entry, err := httpapi.NewToken(user, roles...)
			if err != nil {
				return err
			}
			entry.Grants = policy.Grants{Roles: grantRoles, Scopes: grantScopes}
			if err := (httpapi.Tokens{Tokens: []httpapi.Token{entry}}).Validate(); err != nil {
				return err
			}
			doc, err := json.Marshal(entry)
			if err != nil {
				return err
			}
			fmt.Fprintf(g.out, "token: %s\nentry: %s\n", tok, doc)
			return nil
		},
	}
	token.Flags().StringVar(&user, "user", "", "the user the token acts as (required)")
	token.Flags().StringSliceVar(&roles, "roles", []string{httpapi.RoleRead, httpapi.RoleRun}, "roles: read, run, approve")
	token.Flags().StringSliceVar(&grantRoles, "grant-roles", nil, "policy roles the token's runs hold (requireRoles)")
	token.Flags().StringSliceVar(&grantScopes, "grant-scopes", nil, "policy scopes the token's runs hold (requireScopes)")
	_ = token.MarkFlagRequired("user")
	cmd.AddCommand(token)
	return cmd
}

// checkListen refuses plain HTTP beyond loopback unless insecure is set:
// bearer tokens must not cross a network in the clear.
func checkListen(addr string, tls, insecure bool) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("listen address %q: %w", addr, err)
	}
	if !isLoopback(host) && !tls && !insecure {
		return fmt.Errorf("%s is not a loopback address: serve TLS (--tls-cert, --tls-key) or pass --insecure-http", addr)
	}
	return nil
}
