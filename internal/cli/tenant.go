package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	natsconf "github.com/actionbus/actionbus/deploy/nats"
	"github.com/actionbus/actionbus/internal/events"
)

// tenantCmd is `actionbus tenant`: what adding a tenant takes.
func tenantCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "tenant",
		Short: "Tenants: the NATS users that confine a tenant to its own runs",
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "users TENANT",
		Short: "Print the client and approver users of a tenant, to paste into deploy/nats/accounts.conf",
		Long: `Print the accounts.conf entries of a tenant's client user (client-TENANT)
and approver user (approver-TENANT). Paste them into the users list of the
ACTIONBUS account, set their password variables, and reload nats-server
(nats-server --signal reload). The tenant's applications then connect as
client-TENANT with the inbox prefix _INBOX_TENANT (the CLI does so with
--tenant TENANT; Go programs pass nats.CustomInboxPrefix(client.InboxPrefix(TENANT))
and client.Options{Tenant: TENANT}).

Streams, consumers and buckets are shared: a tenant needs no provisioning.
Executors serve every tenant unless started with --tenants.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := events.CheckTenant(args[0]); err != nil {
				return err
			}
			fmt.Fprint(g.out, natsconf.TenantUsers(args[0]))
			client, approver := natsconf.ClientUser(args[0]), natsconf.ApproverUser(args[0])
			fmt.Fprintf(g.errOut, "# passwords: $%s and $%s\n", natsconf.PasswordVar(client), natsconf.PasswordVar(approver))
			return nil
		},
	})
	return cmd
}
