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
		Short: "Print a tenant's account (its client and approver users), to paste into deploy/nats/accounts.conf",
		Long: `Print the accounts.conf block of a tenant's account: its client user
(client-TENANT), its approver user (approver-TENANT), the imports that carry
exactly its own subjects to and from the ACTIONBUS account, and its limits.
Paste it into the accounts of accounts.conf, set the password variables, and
reload nats-server (nats-server --signal reload). The tenant's applications
then connect as client-TENANT (the CLI with --tenant TENANT; Go programs pass
client.Options{Tenant: TENANT}).

The tenant's runs live in the services' streams: a tenant needs no
provisioning. Executors serve every tenant unless started with --tenants.
Operator mode adds a tenant without editing a file or restarting the server
(actionbus tenant add).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := events.CheckTenant(args[0]); err != nil {
				return err
			}
			fmt.Fprint(g.out, natsconf.TenantAccount(args[0]))
			client, approver := natsconf.ClientUser(args[0]), natsconf.ApproverUser(args[0])
			fmt.Fprintf(g.errOut, "# passwords: $%s and $%s\n", natsconf.PasswordVar(client), natsconf.PasswordVar(approver))
			return nil
		},
	})
	return cmd
}
