package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/accounts"
	"github.com/actionbus/actionbus/internal/bus"
	"github.com/actionbus/actionbus/internal/service"
)

// operatorDirEnv names the environment variable of the operator store's
// directory (--dir).
const operatorDirEnv = "ACTIONBUS_OPERATOR_DIR"

// natsCmd is `actionbus nats`: the operator store of operator mode.
func natsCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "nats", Short: "NATS operator mode: the operator store (keys, account JWTs, creds)"}
	var dir, resolverDir string
	var pools []string
	initCmd := &cobra.Command{
		Use:   "init",
		Short: "Create the operator store: operator, system account, ACTIONBUS account and its service users' creds, and the server config",
		Long: `init creates an operator store in --dir (mode 0700; seeds and creds 0600):
the operator key and JWT, the system account (its user pushes tenant
accounts), the ACTIONBUS account (JetStream, every stream and bucket, its
exports to tenants) and the creds of its users admin and dispatcher, under
DIR/accounts/ACTIONBUS/users/; the accounts of their own of the planner
(PLANNER), the auditor (AUDITOR) and each --pools pool's executors
(POOL_<pool>), each user's creds under DIR/accounts/<ACCOUNT>/users/.
It writes DIR/server.conf, the server config
fragment of operator mode: include it in nats-server's configuration
(include "DIR/server.conf"). The resolver keeps account JWTs in
--resolver-dir (the server's own directory; default DIR/resolver).

Back the directory up: the operator and ACTIONBUS seeds sign every tenant.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dir == "" {
				return fmt.Errorf("--dir (or $%s) is required", operatorDirEnv)
			}
			s, err := accounts.Init(dir, accounts.InitOptions{Prefix: g.prefix, Pools: pools, ResolverDir: resolverDir})
			if err != nil {
				return err
			}
			fmt.Fprintf(g.out, "operator store: %s\nserver config: %s\nservice creds: %s\n", s.Dir, s.ConfigFile(), s.CredsDir(accounts.ServiceAccount))
			for _, a := range accounts.OwnAccounts(pools...) {
				fmt.Fprintf(g.out, "%s creds: %s\n", a.User.Name, s.ServiceCredsFile(a.User.Name))
			}
			return nil
		},
	}
	initCmd.Flags().StringVar(&dir, "dir", envOr(operatorDirEnv, ""), "operator store directory (env "+operatorDirEnv+")")
	initCmd.Flags().StringVar(&resolverDir, "resolver-dir", "", "the server's account JWT directory (default DIR/resolver)")
	initCmd.Flags().StringSliceVar(&pools, "pools", []string{bus.DefaultPool}, "executor pools, one executor user each")
	cmd.AddCommand(initCmd)
	return cmd
}

// tenantCmd is `actionbus tenant`: adding and removing tenants.
func tenantCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "tenant",
		Short: "Tenants: one NATS account each (operator mode: add and remove at run time; static config: print its block)",
	}
	var dir string
	var limits accounts.Limits
	var reuseName bool
	add := &cobra.Command{
		Use:   "add TENANT",
		Short: "Create and sign a tenant's account and its client and approver users, and push the account to the running server",
		Long: `add creates the tenant's account (named TENANT, JetStream disabled, its
imports from ACTIONBUS activated for its own subjects only, the limits
below) and its users client-TENANT and approver-TENANT ("client" and
"approver" for the default tenant), signs them with the operator store's
keys (--dir), writes their creds files (printed), and pushes the account
JWT to the server at --nats through the system account: no restart. The
tenant's applications connect with the client creds and the inbox prefix
_INBOX_TENANT (actionbus --creds FILE --tenant TENANT ...).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := events.CheckTenant(args[0]); err != nil {
				return err
			}
			s, err := openStore(dir)
			if err != nil {
				return err
			}
			if reuseName {
				if err := s.ReuseName(args[0]); err != nil {
					return err
				}
			}
			tn, err := s.AddTenant(args[0], limits)
			if err != nil {
				return err
			}
			if err := pushToServer(cmd.Context(), g, s, func(ctx context.Context, nc *nats.Conn) error {
				return accounts.Push(ctx, nc, tn.JWT)
			}); err != nil {
				return fmt.Errorf("tenant %s is signed in %s but not on the server (push it again with actionbus tenant push %s): %w", tn.Name, s.Dir, tn.Name, err)
			}
			fmt.Fprintf(g.out, "tenant %s: account %s pushed\n  creds: %s\n", tn.Name, tn.Pub, tn.CredsDir)
			return nil
		},
	}
	add.Flags().BoolVar(&reuseName, "reuse-name", false, "give a removed tenant's name to this one, which then reads the runs and audit records the removed one left until they expire")
	add.Flags().Int64Var(&limits.MaxConnections, "max-connections", accounts.DefaultMaxConnections, "most connections of the tenant's users at once")
	add.Flags().Int64Var(&limits.MaxSubscriptions, "max-subscriptions", accounts.DefaultMaxSubscriptions, "most subscriptions across the tenant's connections")
	add.Flags().Int64Var(&limits.MaxPayload, "max-payload", accounts.DefaultMaxPayload, "largest message a tenant user may publish (bytes)")
	push := &cobra.Command{
		Use:   "push TENANT",
		Short: "Push a tenant's stored account JWT to the running server again",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := events.CheckTenant(args[0]); err != nil {
				return err
			}
			s, err := openStore(dir)
			if err != nil {
				return err
			}
			tok, err := s.AccountJWT(args[0])
			if err != nil {
				return fmt.Errorf("no tenant %s in %s", args[0], s.Dir)
			}
			return pushToServer(cmd.Context(), g, s, func(ctx context.Context, nc *nats.Conn) error { return accounts.Push(ctx, nc, tok) })
		},
	}
	remove := &cobra.Command{
		Use:   "remove TENANT",
		Short: "Revoke a tenant's users (their connections close) and delete its account from the server",
		Long: `remove pushes the tenant's account JWT with every user revoked, no imports
and no connections allowed (the server closes the users' connections at
once), then deletes the account from the server's resolver and the
tenant's keys and creds from the operator store. The tenant's runs, events
and audit records stay in ACTIONBUS's streams.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := events.CheckTenant(args[0]); err != nil {
				return err
			}
			s, err := openStore(dir)
			if err != nil {
				return err
			}
			pub, revoked, deletion, err := s.RevokeTenant(args[0])
			if err != nil {
				return err
			}
			if err := pushToServer(cmd.Context(), g, s, func(ctx context.Context, nc *nats.Conn) error {
				if err := accounts.Push(ctx, nc, revoked); err != nil {
					return err
				}
				return accounts.Delete(ctx, nc, deletion)
			}); err != nil {
				return fmt.Errorf("tenant %s is still in %s (run tenant remove again): %w", args[0], s.Dir, err)
			}
			if err := s.Forget(args[0]); err != nil {
				return err
			}
			fmt.Fprintf(g.out, "tenant %s: account %s revoked and deleted\n", args[0], pub)
			return nil
		},
	}
	list := &cobra.Command{
		Use:   "list",
		Short: "List the tenants of the operator store",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := openStore(dir)
			if err != nil {
				return err
			}
			ts, err := s.Tenants()
			if err != nil {
				return err
			}
			for _, t := range ts {
				fmt.Fprintln(g.out, t)
			}
			return nil
		},
	}
	for _, c := range []*cobra.Command{add, push, remove, list} {
		c.Flags().StringVar(&dir, "dir", envOr(operatorDirEnv, ""), "operator store directory (env "+operatorDirEnv+")")
	}
	cmd.AddCommand(add, push, remove, list)
	var staticLimits accounts.Limits
	users := &cobra.Command{
		Use:   "users TENANT",
		Short: "Print a tenant's account block for a static accounts.conf (small deployments)",
		Long: `Print the accounts.conf block of a tenant's account: its client user
(client-TENANT) and approver user (approver-TENANT), its imports from
ACTIONBUS, JetStream disabled, and its limits. Paste it into the accounts
of deploy/nats/accounts.conf, add the tenant to the accounts list of every
ACTIONBUS export, set the password variables, and reload nats-server
(nats-server --signal reload). Operator mode needs none of this:
actionbus tenant add TENANT.

The tenant's applications connect as client-TENANT with the inbox prefix
_INBOX_TENANT (the CLI does so with --tenant TENANT).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := events.CheckTenant(args[0]); err != nil {
				return err
			}
			fmt.Fprint(g.out, accounts.StaticTenantAccount(g.prefix, args[0], staticLimits))
			client, approver := accounts.ClientUser(args[0]), accounts.ApproverUser(args[0])
			fmt.Fprintf(g.errOut, "# passwords: $%s and $%s\n", accounts.PasswordVar(client), accounts.PasswordVar(approver))
			return nil
		},
	}
	users.Flags().Int64Var(&staticLimits.MaxConnections, "max-connections", accounts.DefaultMaxConnections, "most connections of the tenant's users at once")
	users.Flags().Int64Var(&staticLimits.MaxSubscriptions, "max-subscriptions", accounts.DefaultMaxSubscriptions, "most subscriptions across the tenant's connections")
	users.Flags().Int64Var(&staticLimits.MaxPayload, "max-payload", accounts.DefaultMaxPayload, "largest message a tenant user may publish (bytes)")
	cmd.AddCommand(users)
	return cmd
}

func openStore(dir string) (*accounts.Store, error) {
	if dir == "" {
		return nil, fmt.Errorf("--dir (or $%s) is required", operatorDirEnv)
	}
	return accounts.Open(dir)
}

// pushToServer connects to --nats as the store's system user and runs
// push.
func pushToServer(ctx context.Context, g *globals, s *accounts.Store, push func(context.Context, *nats.Conn) error) error {
	url := g.natsURL
	if url == "" {
		url = envOr("NATS_URL", nats.DefaultURL)
	}
	nc, err := nats.Connect(url, nats.Name("actionbus-tenant"),
		nats.UserCredentials(s.CredsFile(accounts.SystemAccount, accounts.SystemUser)))
	if err != nil {
		return fmt.Errorf("connect to %s as the system user: %w", service.RedactURL(url), err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return push(ctx, nc)
}
