// Command gen prints deploy/nats/accounts.conf: the layout of
// internal/accounts rendered for the tenants default, acme and globex.
//
//	go run ./deploy/nats/gen > deploy/nats/accounts.conf
package main

import (
	"fmt"

	natsconf "github.com/actionbus/actionbus/deploy/nats"
)

func main() { fmt.Print(natsconf.WithTenants(natsconf.ExampleTenants...)) }
