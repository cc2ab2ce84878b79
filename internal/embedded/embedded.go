// Package embedded runs a nats-server with JetStream inside the current
// process, for `actionbus dev`, tests and benchmarks.
//
// It is not a way to run production NATS: use deploy/nats for that.
package embedded

import (
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Options configures an embedded server.
type Options struct {
	// Host to listen on; default 127.0.0.1.
	Host string
	// Port to listen on; -1 (the default when 0 is given) picks a free port.
	Port int
	// StoreDir is the JetStream store directory. Required: a shared default
	// would leak state between runs.
	StoreDir string
	// ServerName names the server; default "actionbus-embedded".
	ServerName string
	// ReadyTimeout bounds the wait for the server to accept connections;
	// default 10s.
	ReadyTimeout time.Duration
	// ConfigFile, when set, is a nats-server configuration file (accounts,
	// users, permissions) read first; Host, Port, StoreDir and ServerName
	// above still apply.
	ConfigFile string
	// OperatorDir, when set, starts the server in operator mode from the
	// operator store in that directory (accounts.Init wrote it): trusted
	// operator, system account, full account resolver (account JWTs
	// pushed at run time apply without a restart), the system and
	// ACTIONBUS accounts preloaded. It reads the store's server.conf and
	// excludes ConfigFile.
	OperatorDir string
	// MaxPayload is the largest message the server accepts; default the
	// server's own default (1 MB), as in production, so that tests meet
	// the same limit a deployment does.
	MaxPayload int32
	// LeafNodePort, when not 0, accepts leaf node connections on Host at
	// this port (-1 picks a free one): a hub that executors' leaf nodes
	// connect to (deploy/nats/leaf.conf). Default 0: none.
	LeafNodePort int
	// JetStreamDomain names the server's JetStream domain, which leaf
	// nodes' clients reach it by (deploy/nats: "actionbus"). Default "".
	JetStreamDomain string
}

// Start starts a JetStream-enabled server and waits until it accepts
// connections. The caller must call Shutdown (and WaitForShutdown) on it.
func Start(opts Options) (*server.Server, error) {
	if opts.StoreDir == "" {
		return nil, errors.New("embedded: StoreDir is required")
	}
	if opts.Host == "" {
		opts.Host = "127.0.0.1"
	}
	if opts.Port == 0 {
		opts.Port = -1
	}
	if opts.ServerName == "" {
		opts.ServerName = "actionbus-embedded"
	}
	if opts.ReadyTimeout == 0 {
		opts.ReadyTimeout = 10 * time.Second
	}
	if opts.OperatorDir != "" {
		if opts.ConfigFile != "" {
			return nil, errors.New("embedded: OperatorDir and ConfigFile exclude each other")
		}
		opts.ConfigFile = filepath.Join(opts.OperatorDir, "server.conf")
	}
	so := &server.Options{}
	if opts.ConfigFile != "" {
		var err error
		if so, err = server.ProcessConfigFile(opts.ConfigFile); err != nil {
			return nil, fmt.Errorf("embedded: config %s: %w", opts.ConfigFile, err)
		}
	}
	so.ServerName, so.Host, so.Port = opts.ServerName, opts.Host, opts.Port
	so.JetStream, so.StoreDir = true, opts.StoreDir
	if opts.JetStreamDomain != "" {
		so.JetStreamDomain = opts.JetStreamDomain
	}
	so.NoSigs, so.NoLog = true, true
	if opts.MaxPayload > 0 {
		so.MaxPayload = opts.MaxPayload
	}
	if opts.LeafNodePort != 0 {
		so.LeafNode.Host, so.LeafNode.Port = opts.Host, opts.LeafNodePort
		// Leaf nodes reconnect to the URLs they were given only (one
		// server has no other to advertise).
		so.LeafNode.NoAdvertise = true
	}
	ns, err := server.NewServer(so)
	if err != nil {
		return nil, fmt.Errorf("embedded: new server: %w", err)
	}
	ns.Start()
	if !ns.ReadyForConnections(opts.ReadyTimeout) {
		ns.Shutdown()
		return nil, fmt.Errorf("embedded: server not ready after %s", opts.ReadyTimeout)
	}
	return ns, nil
}
