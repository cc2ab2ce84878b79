// Package natsconf holds the deployment's NATS configuration
// (accounts.conf: the ACTIONBUS account and the least-privilege user of
// every service, client and approver) for programs and tests that start a
// server with it, such as actionbustest with Options.Users.
package natsconf

import (
	_ "embed"
	"strconv"
	"strings"
)

// Accounts is accounts.conf as shipped. Each user's password is the
// environment variable <USER>_PASSWORD, which nats-server resolves when it
// reads the file.
//
//go:embed accounts.conf
var Accounts string

// Users are the users Accounts defines.
var Users = []string{"admin", "dispatcher", "planner", "executor", "auditor", "client", "approver"}

// WithPasswords returns Accounts with every user's password variable
// replaced by password(user), quoted, so that no environment is needed.
func WithPasswords(password func(user string) string) string {
	out := Accounts
	for _, u := range Users {
		out = strings.ReplaceAll(out, "$"+strings.ToUpper(u)+"_PASSWORD", strconv.Quote(password(u)))
	}
	return out
}
