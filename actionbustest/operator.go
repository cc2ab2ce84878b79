package actionbustest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/accounts"
)

// TenantLimits are a tenant account's limits, as `actionbus tenant add`
// sets them. A zero field is its default: 64 connections, 10 000
// subscriptions, a largest message of 1 MiB (docs/tenants.md).
type TenantLimits struct {
	// MaxConnections is the most connections of the account's users at
	// once; the next one is refused by the server.
	MaxConnections int64
	// MaxSubscriptions is the most subscriptions across the account's
	// connections.
	MaxSubscriptions int64
	// MaxPayload is the largest message a tenant user may publish.
	MaxPayload int64
}

// TenantAdd adds tenant's account and users on a server started with
// Options.Operator, as `actionbus tenant add` does (the account JWT
// pushed through the system account, no restart), and returns a
// connection of the tenant's client user (inbox prefix
// _INBOX_<tenant>), closed in t.Cleanup. l are the account's limits
// (zero: the defaults). It fails the test where [Server.AddTenant]
// returns an error.
func (s *Server) TenantAdd(t testing.TB, tenant string, l TenantLimits) *nats.Conn {
	t.Helper()
	nc, err := s.AddTenant(t, tenant, l)
	if err != nil {
		t.Fatalf("actionbustest: %v", err)
	}
	return nc
}

// AddTenant is [Server.TenantAdd] returning the operator's refusal (a
// name already in use, or one a removed tenant left data under) as an
// error, with nothing added.
func (s *Server) AddTenant(t testing.TB, tenant string, l TenantLimits) (*nats.Conn, error) {
	t.Helper()
	s.mustOperator(t)
	tn, err := s.accounts.AddTenant(tenant, accounts.Limits(l))
	if err != nil {
		return nil, fmt.Errorf("add tenant %s: %w", tenant, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := accounts.Push(ctx, s.sysConn(t), tn.JWT); err != nil {
		return nil, fmt.Errorf("push tenant %s: %w", tenant, err)
	}
	return s.TenantUserConnect(t, tenant, accounts.ClientUser(tenant)), nil
}

// TenantCredsFile is the creds file of user (client-T or approver-T,
// "client" or "approver" for the default tenant) of tenant's account, on
// a server started with Options.Operator.
func (s *Server) TenantCredsFile(t testing.TB, tenant, user string) string {
	t.Helper()
	s.mustOperator(t)
	return s.accounts.CredsFile(tenant, user)
}

// ServiceCredsFile is the creds file of a service user (dispatcher,
// planner, auditor, admin of the ACTIONBUS account; executor, of its
// pool's account), on a server started with Options.Operator.
func (s *Server) ServiceCredsFile(t testing.TB, user string) string {
	t.Helper()
	s.mustOperator(t)
	return s.accounts.ServiceCredsFile(user)
}

// TenantRemove revokes tenant's account and deletes it from the server,
// as `actionbus tenant remove` does.
func (s *Server) TenantRemove(t testing.TB, tenant string) {
	t.Helper()
	s.mustOperator(t)
	_, revoked, deletion, err := s.accounts.RevokeTenant(tenant)
	if err != nil {
		t.Fatalf("actionbustest: remove tenant %s: %v", tenant, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := accounts.Push(ctx, s.sysConn(t), revoked); err != nil {
		t.Fatalf("actionbustest: push revoked tenant %s: %v", tenant, err)
	}
	if err := accounts.Delete(ctx, s.sysConn(t), deletion); err != nil {
		t.Fatalf("actionbustest: delete tenant %s: %v", tenant, err)
	}
	if err := s.accounts.Forget(tenant); err != nil {
		t.Fatalf("actionbustest: forget tenant %s: %v", tenant, err)
	}
}

// TenantUserConnect connects as user (client-T or approver-T, "client"
// or "approver" for the default tenant) of tenant's account, with the
// tenant's inbox prefix; closed in t.Cleanup.
func (s *Server) TenantUserConnect(t testing.TB, tenant, user string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	s.mustOperator(t)
	nc, err := s.DialCreds(s.TenantCredsFile(t, tenant, user), append([]nats.Option{nats.Name(t.Name()),
		nats.CustomInboxPrefix(accounts.InboxPrefix(events.TenantOr(tenant)))}, opts...)...)
	if err != nil {
		t.Fatalf("actionbustest: connect as %s of %s: %v", user, tenant, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// ServiceConnect connects as a service user of the ACTIONBUS account
// (dispatcher, planner, auditor, executor, admin) with its inbox prefix
// _INBOX_<user>; closed in t.Cleanup.
func (s *Server) ServiceConnect(t testing.TB, user string) *nats.Conn {
	t.Helper()
	s.mustOperator(t)
	nc, err := s.DialCreds(s.ServiceCredsFile(t, user), nats.Name(t.Name()),
		nats.CustomInboxPrefix(accounts.InboxPrefix(user)))
	if err != nil {
		t.Fatalf("actionbustest: connect as %s: %v", user, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// DialCreds connects with the creds file, without retrying: the error is
// the server's answer (authorization violation, maximum connections).
func (s *Server) DialCreds(creds string, opts ...nats.Option) (*nats.Conn, error) {
	return nats.Connect(s.URL, append([]nats.Option{nats.UserCredentials(creds)}, opts...)...)
}

func (s *Server) sysConn(t testing.TB) *nats.Conn {
	t.Helper()
	s.sysMu.Lock()
	defer s.sysMu.Unlock()
	if s.sys == nil {
		nc, err := s.DialCreds(s.accounts.CredsFile(accounts.SystemAccount, accounts.SystemUser), nats.Name("actionbustest-sys"))
		if err != nil {
			t.Fatalf("actionbustest: connect as the system user: %v", err)
		}
		t.Cleanup(nc.Close)
		s.sys = nc
	}
	return s.sys
}

func (s *Server) mustOperator(t testing.TB) {
	t.Helper()
	if s.accounts == nil {
		t.Fatal("actionbustest: the server was not started with Options.Operator")
	}
}
