package accounts

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/actionbus/actionbus/events"
)

// Store is the operator store on disk: every key and JWT operator mode
// needs. Its layout (the directory is 0700, every seed and creds file
// 0600):
//
//	operator.nk, operator.jwt            the operator's seed and JWT
//	accounts/<NAME>/account.nk|.jwt      SYS, ACTIONBUS, one per tenant
//	accounts/<NAME>/users/<user>.creds   each account's users
//	resolver/                            the server's JWT directory (default)
//	server.conf                          the server config fragment
//
// Back the whole directory up: the operator seed signs every account, the
// ACTIONBUS seed every activation, and neither can be recovered.
type Store struct {
	// Dir is the store's directory.
	Dir string
	// Prefix is the subject prefix; default "ab".
	Prefix string
}

// InitOptions configures [Init].
type InitOptions struct {
	// Prefix is the subject prefix; default "ab".
	Prefix string
	// Pools are the executor pools whose executor users to create;
	// default ["default"].
	Pools []string
	// ResolverDir is where the server keeps account JWTs; default
	// <dir>/resolver.
	ResolverDir string
	// OperatorName names the operator; default "actionbus".
	OperatorName string
}

const (
	dirMode  = 0o700
	seedMode = 0o600
	jwtMode  = 0o644
)

// Init creates a new operator store in dir (which must not hold one):
// the operator, the system account and its user, the ACTIONBUS account
// with its service users' creds, the accounts of their own (planner,
// auditor, one per pool) with their users' creds, and server.conf.
func Init(dir string, o InitOptions) (*Store, error) {
	if o.OperatorName == "" {
		o.OperatorName = "actionbus"
	}
	if o.ResolverDir == "" {
		o.ResolverDir = filepath.Join(dir, "resolver")
	}
	s := &Store{Dir: dir, Prefix: prefixOr(o.Prefix)}
	if _, err := os.Stat(s.path("operator.nk")); err == nil {
		return nil, fmt.Errorf("accounts: %s already holds an operator store", dir)
	}
	if err := os.MkdirAll(dir, dirMode); err != nil {
		return nil, err
	}
	if err := os.Chmod(dir, dirMode); err != nil {
		return nil, err
	}
	okp, err := nkeys.CreateOperator()
	if err != nil {
		return nil, err
	}
	sys, err := nkeys.CreateAccount()
	if err != nil {
		return nil, err
	}
	svc, err := nkeys.CreateAccount()
	if err != nil {
		return nil, err
	}
	sysPub, _ := sys.PublicKey()
	svcPub, _ := svc.PublicKey()
	opJWT, err := OperatorClaims(o.OperatorName, okp, sysPub)
	if err != nil {
		return nil, err
	}
	if err := writeSeed(s.path("operator.nk"), okp); err != nil {
		return nil, err
	}
	if err := writeFile(s.path("operator.jwt"), []byte(opJWT), jwtMode); err != nil {
		return nil, err
	}
	sysJWT, err := SystemAccountClaims(sysPub).Encode(okp)
	if err != nil {
		return nil, err
	}
	if err := s.writeAccount(SystemAccount, sys, sysJWT); err != nil {
		return nil, err
	}
	if err := s.writeUsers(SystemAccount, sys, []User{{Name: SystemUser}}); err != nil {
		return nil, err
	}
	svcJWT, err := ServiceAccountClaims(svcPub, s.Prefix, o.Pools...).Encode(okp)
	if err != nil {
		return nil, err
	}
	if err := s.writeAccount(ServiceAccount, svc, svcJWT); err != nil {
		return nil, err
	}
	if err := s.writeUsers(ServiceAccount, svc, ServiceUsers(o.Pools...)); err != nil {
		return nil, err
	}
	preload := map[string]string{sysPub: sysJWT, svcPub: svcJWT}
	for _, a := range OwnAccounts(o.Pools...) {
		akp, err := nkeys.CreateAccount()
		if err != nil {
			return nil, err
		}
		pub, _ := akp.PublicKey()
		ac, err := OwnAccountClaims(a, pub, s.Prefix, svc)
		if err != nil {
			return nil, err
		}
		tok, err := ac.Encode(okp)
		if err != nil {
			return nil, err
		}
		if err := s.writeAccount(a.Name, akp, tok); err != nil {
			return nil, err
		}
		if err := s.writeUsers(a.Name, akp, []User{a.User}); err != nil {
			return nil, err
		}
		preload[pub] = tok
	}
	if err := os.MkdirAll(o.ResolverDir, dirMode); err != nil {
		return nil, err
	}
	conf := ServerConfig(s.path("operator.jwt"), sysPub, o.ResolverDir, preload)
	if err := writeFile(s.path("server.conf"), []byte(conf), seedMode); err != nil {
		return nil, err
	}
	if err := writeFile(s.path("prefix"), []byte(s.Prefix+"\n"), jwtMode); err != nil {
		return nil, err
	}
	return s, nil
}

// Open opens the operator store in dir.
func Open(dir string) (*Store, error) {
	s := &Store{Dir: dir}
	if _, err := os.Stat(s.path("operator.nk")); err != nil {
		return nil, fmt.Errorf("accounts: %s holds no operator store (actionbus nats init --dir %s)", dir, dir)
	}
	b, err := os.ReadFile(s.path("prefix"))
	if err != nil {
		return nil, err
	}
	s.Prefix = prefixOr(strings.TrimSpace(string(b)))
	return s, nil
}

// ServerConfig returns the nats-server configuration fragment of
// operator mode: the operator JWT file, the system account, a full
// account resolver in resolverDir that allows deletion, and the system
// and service accounts preloaded.
func ServerConfig(operatorJWT, sysPub, resolverDir string, preload map[string]string) string {
	var b strings.Builder
	b.WriteString("# actionbus operator mode (written by actionbus nats init).\n")
	// A service user's JWT, with its permissions, travels in the CONNECT
	// line; the dispatcher's is over the default 4 KiB.
	b.WriteString("max_control_line: 32768\n")
	fmt.Fprintf(&b, "operator: %s\n", strconv.Quote(operatorJWT))
	fmt.Fprintf(&b, "system_account: %s\n", sysPub)
	fmt.Fprintf(&b, "resolver {\n  type: full\n  dir: %s\n  allow_delete: true\n  interval: \"2m\"\n}\n", strconv.Quote(resolverDir))
	b.WriteString("resolver_preload {\n")
	for _, k := range sortedKeys(preload) {
		fmt.Fprintf(&b, "  %s: %s\n", k, strconv.Quote(preload[k]))
	}
	b.WriteString("}\n")
	return b.String()
}

// ConfigFile is the path of the store's server config fragment.
func (s *Store) ConfigFile() string { return s.path("server.conf") }

// CredsFile returns the path of the creds file of account's user.
func (s *Store) CredsFile(account, user string) string {
	return s.path("accounts", account, "users", user+".creds")
}

// ServiceCredsFile returns the path of the creds file of a service user
// (admin, dispatcher, planner, auditor, or a pool's executor user, whose
// account is its pool's: [AccountOf]).
func (s *Store) ServiceCredsFile(user string) string { return s.CredsFile(AccountOf(user), user) }

// CredsDir returns the directory of account's users' creds files.
func (s *Store) CredsDir(account string) string { return s.path("accounts", account, "users") }

// Tenant is a tenant account [Store.AddTenant] made.
type Tenant struct {
	Name string
	// Pub is the account's public key.
	Pub string
	// JWT is the account JWT to push to the server.
	JWT string
	// CredsDir holds the users' creds files (client, approver).
	CredsDir string
}

// AddTenant creates and signs tenant's account (named after it, its
// imports, limits l) and its client and approver users, and writes them
// to the store. It refuses an invalid or reserved tenant name and a
// tenant the store already has.
func (s *Store) AddTenant(tenant string, l Limits) (Tenant, error) {
	if err := events.CheckTenant(tenant); err != nil {
		return Tenant{}, err
	}
	if err := l.Validate(); err != nil {
		return Tenant{}, err
	}
	if _, err := os.Stat(s.path("accounts", tenant)); err == nil {
		return Tenant{}, fmt.Errorf("accounts: tenant %s exists (actionbus tenant remove %s first)", tenant, tenant)
	}
	if at, removed := s.Removed(tenant); removed {
		// Its runs, events, audit records and artifacts stay in the
		// services' streams under its name until they expire: an account
		// of that name would read them.
		return Tenant{}, fmt.Errorf("accounts: tenant %s was removed at %s, and what it left is still stored under its name; choose another name, or give this one's records to the new tenant with actionbus tenant add --reuse-name",
			tenant, at.Format(time.RFC3339))
	}
	okp, err := s.operator()
	if err != nil {
		return Tenant{}, err
	}
	pools, err := s.pools()
	if err != nil {
		return Tenant{}, err
	}
	exporters := Exporters{}
	names := []string{ServiceAccount, PlannerAccount, AuditorAccount}
	for _, p := range pools {
		names = append(names, PoolAccount(p))
	}
	for _, name := range names {
		kp, err := s.accountKey(name)
		if err != nil {
			return Tenant{}, fmt.Errorf("accounts: the key of %s (a store made before the planner and the auditor had accounts of their own needs actionbus nats init again): %w", name, err)
		}
		exporters[name] = kp
	}
	akp, err := nkeys.CreateAccount()
	if err != nil {
		return Tenant{}, err
	}
	pub, _ := akp.PublicKey()
	ac, err := TenantAccountClaims(s.Prefix, tenant, pub, exporters, l, pools...)
	if err != nil {
		return Tenant{}, err
	}
	tok, err := ac.Encode(okp)
	if err != nil {
		return Tenant{}, err
	}
	if err := s.writeAccount(tenant, akp, tok); err != nil {
		return Tenant{}, err
	}
	if err := s.writeUsers(tenant, akp, TenantUsers(s.Prefix, tenant)); err != nil {
		return Tenant{}, err
	}
	return Tenant{Name: tenant, Pub: pub, JWT: tok, CredsDir: s.CredsDir(tenant)}, nil
}

// RevokeTenant signs tenant's account as revoked ([RevokedTenantClaims])
// and the request deleting it. It returns the account's public key, the
// revoked account JWT (push it first: it closes the users' connections)
// and the deletion request. The store keeps the tenant until [Store.Forget]:
// a push that fails can be tried again.
func (s *Store) RevokeTenant(tenant string) (pub, revoked, deletion string, err error) {
	if err := events.CheckTenant(tenant); err != nil {
		return "", "", "", err
	}
	b, err := os.ReadFile(s.path("accounts", tenant, "account.jwt"))
	if errors.Is(err, fs.ErrNotExist) {
		return "", "", "", fmt.Errorf("accounts: no tenant %s in %s", tenant, s.Dir)
	} else if err != nil {
		return "", "", "", err
	}
	ac, err := jwt.DecodeAccountClaims(string(b))
	if err != nil {
		return "", "", "", err
	}
	okp, err := s.operator()
	if err != nil {
		return "", "", "", err
	}
	if revoked, err = RevokedTenantClaims(tenant, ac.Subject, time.Now()).Encode(okp); err != nil {
		return "", "", "", err
	}
	if deletion, err = DeleteClaims(okp, ac.Subject); err != nil {
		return "", "", "", err
	}
	return ac.Subject, revoked, deletion, nil
}

// Forget removes tenant's keys, JWT and creds from the store (after the
// server applied [Store.RevokeTenant]'s JWTs), and records the name as
// removed: [Store.AddTenant] refuses it until [Store.ReuseName].
func (s *Store) Forget(tenant string) error {
	if err := events.CheckTenant(tenant); err != nil {
		return err
	}
	if err := os.MkdirAll(s.path("removed"), 0o700); err != nil {
		return err
	}
	if err := writeFile(s.path("removed", tenant), []byte(time.Now().UTC().Format(time.RFC3339)+"\n"), 0o600); err != nil {
		return err
	}
	return os.RemoveAll(s.path("accounts", tenant))
}

// Removed reports whether tenant was removed (and when): its name is not
// given to a new tenant unless the operator says so ([Store.ReuseName]).
func (s *Store) Removed(tenant string) (time.Time, bool) {
	b, err := os.ReadFile(s.path("removed", tenant))
	if err != nil {
		return time.Time{}, false
	}
	at, _ := time.Parse(time.RFC3339, strings.TrimSpace(string(b)))
	return at, true
}

// ReuseName lets [Store.AddTenant] give a removed tenant's name to a new
// tenant, which then reads what the removed one left under that name
// until it expires: an operator's explicit decision.
func (s *Store) ReuseName(tenant string) error {
	if err := events.CheckTenant(tenant); err != nil {
		return err
	}
	err := os.Remove(s.path("removed", tenant))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}

// pools lists the pools whose accounts the store holds.
func (s *Store) pools() ([]string, error) {
	return s.accounts(func(name string) (string, bool) { return strings.CutPrefix(name, PoolAccount("")) })
}

// Tenants lists the tenants in the store.
func (s *Store) Tenants() ([]string, error) {
	return s.accounts(func(name string) (string, bool) { return name, events.ValidTenant(name) })
}

// accounts lists what keep makes of the names of the store's accounts,
// those it keeps.
func (s *Store) accounts(keep func(name string) (string, bool)) ([]string, error) {
	ents, err := os.ReadDir(s.path("accounts"))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if v, ok := keep(e.Name()); ok && e.IsDir() {
			out = append(out, v)
		}
	}
	return out, nil
}

// AccountJWT returns the stored JWT of account name.
func (s *Store) AccountJWT(name string) (string, error) {
	b, err := os.ReadFile(s.path("accounts", name, "account.jwt"))
	return string(b), err
}

// SignUser creates a user u of account name (its key must be in the
// store) and returns its creds, without writing them: for tests that act
// as a user with other permissions than the layout's.
func (s *Store) SignUser(name string, u User) ([]byte, error) {
	akp, err := s.accountKey(name)
	if err != nil {
		return nil, err
	}
	creds, _, err := Creds(u, akp)
	return creds, err
}

func (s *Store) path(elem ...string) string {
	return filepath.Join(append([]string{s.Dir}, elem...)...)
}

func (s *Store) operator() (nkeys.KeyPair, error) { return readSeed(s.path("operator.nk")) }

func (s *Store) accountKey(name string) (nkeys.KeyPair, error) {
	return readSeed(s.path("accounts", name, "account.nk"))
}

func (s *Store) writeAccount(name string, kp nkeys.KeyPair, tok string) error {
	if err := os.MkdirAll(s.path("accounts", name, "users"), dirMode); err != nil {
		return err
	}
	if err := writeSeed(s.path("accounts", name, "account.nk"), kp); err != nil {
		return err
	}
	return writeFile(s.path("accounts", name, "account.jwt"), []byte(tok), jwtMode)
}

func (s *Store) writeUsers(account string, kp nkeys.KeyPair, users []User) error {
	for _, u := range users {
		creds, _, err := Creds(u, kp)
		if err != nil {
			return err
		}
		if err := writeFile(s.CredsFile(account, u.Name), creds, seedMode); err != nil {
			return err
		}
	}
	return nil
}

func writeSeed(path string, kp nkeys.KeyPair) error {
	seed, err := kp.Seed()
	if err != nil {
		return err
	}
	return writeFile(path, seed, seedMode)
}

func readSeed(path string) (nkeys.KeyPair, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return nkeys.FromSeed([]byte(strings.TrimSpace(string(b))))
}

// writeFile writes data to path with mode, creating it with that mode
// (never wider for a moment) and replacing it atomically.
func writeFile(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

func sortedKeys(m map[string]string) []string { return slices.Sorted(maps.Keys(m)) }
