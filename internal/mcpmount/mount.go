// Package mcpmount mounts MCP servers on an executor: every tool of a
// server becomes an action <server>.<tool> — its input schema the tool's,
// its mode from the tool's annotations (readOnlyHint: read; anything else
// mutate, so approvals apply: the conservative default), its metadata
// untrusted unless the host says otherwise (policy asks for every call of
// an untrusted server's tools). A tool's result is its structured content,
// else its text; embedded resources are stored as artifacts; isError is a
// typed failure (mcp_tool_error) with the tool's message. A change of the
// server's tool list updates the catalog; a stdio server that dies is
// started again with backoff, and calls carry the action's deadline and
// cancellation.
package mcpmount

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/tracing"
)

// ServerConfig is one MCP server to mount: a stdio command or a
// streamable HTTP endpoint.
type ServerConfig struct {
	// Name prefixes the server's actions (<name>.<tool>).
	Name string `json:"name"`
	// Command and Env start a stdio server (Env is its whole
	// environment besides PATH).
	Command []string          `json:"command,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	// URL and Headers reach a streamable HTTP server.
	URL     string            `json:"url,omitempty"`
	Headers map[string]string `json:"headers,omitempty"`
	// Trusted takes the server's tool metadata as the host's: policy
	// judges its tools by mode and tier instead of asking for each call.
	Trusted bool `json:"trusted,omitempty"`
}

var (
	nameRe     = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,31}$`)
	toolNameRe = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
)

// Validate checks a server configuration.
func (c ServerConfig) Validate() error {
	switch {
	case !nameRe.MatchString(c.Name):
		return fmt.Errorf("mcp server %q: the name must be 1–32 of a-z 0-9 _ -", c.Name)
	case (len(c.Command) == 0) == (c.URL == ""):
		return fmt.Errorf("mcp server %s: give a command (stdio) or a url (streamable HTTP), not both", c.Name)
	}
	return nil
}

// Load reads a JSON list of server configurations.
func Load(path string) ([]ServerConfig, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []ServerConfig
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&out); err != nil {
		return nil, fmt.Errorf("mcp servers %s: %w", path, err)
	}
	for _, c := range out {
		if err := c.Validate(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Mount is one mounted server.
type Mount struct {
	cfg ServerConfig
	ex  *executor.Executor
	log *slog.Logger

	mu      sync.Mutex
	session *mcp.ClientSession
	tools   map[string]string // tool name → its definition's JSON (for changes)
	changed chan struct{}
}

// Start connects to the server, registers its tools on ex and keeps them
// in step with the server until ctx ends. Registered before ex runs, the
// tools are published with its other actions; afterwards Start publishes
// them itself.
func Start(ctx context.Context, ex *executor.Executor, cfg ServerConfig, log *slog.Logger) (*Mount, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m := &Mount{cfg: cfg, ex: ex, log: log.With("mcp_server", cfg.Name), tools: map[string]string{}, changed: make(chan struct{}, 1)}
	if err := m.connect(ctx); err != nil {
		return nil, err
	}
	if err := m.sync(ctx); err != nil {
		return nil, err
	}
	go m.supervise(ctx)
	return m, nil
}

// Tools lists the mounted tools' action names.
func (m *Mount) Tools() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]string, 0, len(m.tools))
	for t := range m.tools {
		out = append(out, m.actionName(t))
	}
	slices.Sort(out)
	return out
}

func (m *Mount) actionName(tool string) string { return m.cfg.Name + "." + tool }

func (m *Mount) transport() mcp.Transport {
	if m.cfg.URL != "" {
		return &mcp.StreamableClientTransport{Endpoint: m.cfg.URL, HTTPClient: &http.Client{Transport: headers{m.cfg.Headers, http.DefaultTransport}}}
	}
	cmd := exec.Command(m.cfg.Command[0], m.cfg.Command[1:]...)
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin"}
	for k, v := range m.cfg.Env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	return &mcp.CommandTransport{Command: cmd, TerminateDuration: time.Second}
}

func (m *Mount) connect(ctx context.Context) error {
	c := mcp.NewClient(&mcp.Implementation{Name: "actionbus-executor", Version: "1"}, &mcp.ClientOptions{
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {
			select {
			case m.changed <- struct{}{}:
			default:
			}
		},
	})
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	s, err := c.Connect(cctx, m.transport(), nil)
	if err != nil {
		return fmt.Errorf("mcp server %s: %w", m.cfg.Name, err)
	}
	m.mu.Lock()
	m.session = s
	m.mu.Unlock()
	return nil
}

// supervise restarts a server whose session ended (with backoff, 100 ms
// doubling to 10 s) and follows its tool list.
func (m *Mount) supervise(ctx context.Context) {
	for {
		m.mu.Lock()
		s := m.session
		m.mu.Unlock()
		ended := make(chan struct{})
		go func() { _ = s.Wait(); close(ended) }()
		if !m.follow(ctx, s, ended) {
			return
		}
		m.mu.Lock()
		m.session = nil
		m.mu.Unlock()
		m.log.Warn("mcp server ended; starting it again")
		for delay := 100 * time.Millisecond; ; delay = min(delay*2, 10*time.Second) {
			select {
			case <-ctx.Done():
				return
			case <-time.After(delay):
			}
			if err := m.connect(ctx); err != nil {
				m.log.Warn("mcp server not back yet", "err", err)
				continue
			}
			if err := m.sync(ctx); err != nil {
				m.log.Warn("tool list refresh failed", "err", err)
			}
			break
		}
	}
}

// follow keeps session s's tools in step with the server until the
// session ends (true) or ctx does (false, the session closed).
func (m *Mount) follow(ctx context.Context, s *mcp.ClientSession, ended <-chan struct{}) bool {
	for {
		select {
		case <-ctx.Done():
			_ = s.Close()
			return false
		case <-ended:
			return true
		case <-m.changed:
			if err := m.sync(ctx); err != nil && ctx.Err() == nil {
				m.log.Warn("tool list refresh failed", "err", err)
			}
		}
	}
}

// sync registers the server's current tools, unregisters the gone ones
// and publishes the change.
func (m *Mount) sync(ctx context.Context) error {
	m.mu.Lock()
	s := m.session
	m.mu.Unlock()
	if s == nil {
		return errors.New("not connected")
	}
	res, err := s.ListTools(ctx, nil)
	if err != nil {
		return fmt.Errorf("mcp server %s: list tools: %w", m.cfg.Name, err)
	}
	seen := map[string]bool{}
	changed := false
	for _, t := range res.Tools {
		if !toolNameRe.MatchString(t.Name) {
			m.log.Warn("skipping a tool with an unusable name", "tool", t.Name)
			continue
		}
		seen[t.Name] = true
		def, _ := json.Marshal(t)
		m.mu.Lock()
		same := m.tools[t.Name] == string(def)
		m.mu.Unlock()
		if same {
			continue
		}
		executor.Unregister(m.ex, m.actionName(t.Name))
		if err := m.register(t); err != nil {
			m.log.Warn("skipping a tool that cannot be an action", "tool", t.Name, "err", err)
			continue
		}
		m.mu.Lock()
		m.tools[t.Name] = string(def)
		m.mu.Unlock()
		changed = true
	}
	m.mu.Lock()
	for name := range m.tools {
		if !seen[name] {
			executor.Unregister(m.ex, m.actionName(name))
			delete(m.tools, name)
			changed = true
		}
	}
	m.mu.Unlock()
	if changed {
		return m.ex.Publish(ctx)
	}
	return nil
}

// register makes one tool an action.
func (m *Mount) register(t *mcp.Tool) error {
	schema, err := json.Marshal(t.InputSchema)
	if err != nil || string(schema) == "null" {
		schema = []byte(`{"type":"object"}`)
	}
	readOnly := t.Annotations != nil && t.Annotations.ReadOnlyHint
	mode, tier := executor.ModeMutate, 2
	if readOnly {
		mode, tier = executor.ModeRead, 0
	}
	destructive := !readOnly && (t.Annotations == nil || t.Annotations.DestructiveHint == nil || *t.Annotations.DestructiveHint)
	source := "mcp_server"
	if m.cfg.Trusted {
		source = "host_metadata"
	}
	perm := &executor.Permission{Effect: "external_tool", ReadOnly: &readOnly, Destructive: &destructive, Source: source}
	desc := t.Description
	if desc == "" {
		desc = "MCP tool " + t.Name + " of " + m.cfg.Name
	}
	tool := t.Name
	return executor.Register(m.ex, executor.Action{Name: m.actionName(tool), Description: desc, Mode: mode, Tier: tier,
		InputSchema: schema, OutputSchema: json.RawMessage(`{}`), Permission: perm, Tags: []string{"mcp", m.cfg.Name},
		Planner: &executor.PlannerMeta{ArgsSchemaOptOut: "the MCP server's own schema"}},
		func(ctx context.Context, args map[string]any, call executor.Call) (executor.Result[any], error) {
			return m.call(ctx, tool, args, call)
		})
}

// call runs one tool call with the action's deadline and cancellation.
func (m *Mount) call(ctx context.Context, tool string, args map[string]any, call executor.Call) (executor.Result[any], error) {
	m.mu.Lock()
	s := m.session
	m.mu.Unlock()
	if s == nil {
		return executor.Result[any]{}, actionbus.Errorf(actionbus.CodeMCPUnavailable, "mcp server %s is starting again; retry", m.cfg.Name)
	}
	// The call's span (execute_tool) travels to the server in params._meta.
	res, err := s.CallTool(ctx, &mcp.CallToolParams{Meta: tracing.ToMeta(ctx), Name: tool, Arguments: args})
	if err != nil {
		if ctx.Err() != nil {
			return executor.Result[any]{}, ctx.Err()
		}
		return executor.Result[any]{}, actionbus.Errorf(actionbus.CodeMCPUnavailable, "mcp server %s: %v", m.cfg.Name, err)
	}
	var texts []string
	var artifacts []executor.ArtifactRef
	for i, c := range res.Content {
		switch c := c.(type) {
		case *mcp.TextContent:
			texts = append(texts, c.Text)
		case *mcp.EmbeddedResource:
			if c.Resource == nil {
				continue
			}
			data := c.Resource.Blob
			if len(data) == 0 {
				data = []byte(c.Resource.Text)
			}
			ref, perr := call.PutArtifact(ctx, fmt.Sprintf("resource-%d", i), orDefault(c.Resource.MIMEType, "application/octet-stream"), data)
			if perr == nil {
				artifacts = append(artifacts, ref)
			}
		}
	}
	if res.IsError {
		return executor.Result[any]{}, actionbus.Errorf(actionbus.CodeMCPToolError, "%s", orDefault(strings.Join(texts, "\n"), "the tool reported an error")).
			WithDetail("tool", tool).WithDetail("server", m.cfg.Name)
	}
	var out any
	if res.StructuredContent != nil {
		out = res.StructuredContent
	} else {
		out = map[string]any{"text": strings.Join(texts, "\n")}
	}
	if len(artifacts) > 0 {
		out = map[string]any{"result": out, "artifacts": artifacts}
	}
	return executor.Result[any]{Output: out, Summary: preview(strings.Join(texts, " "))}, nil
}

type headers struct {
	h    map[string]string
	next http.RoundTripper
}

func (h headers) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range h.h {
		r.Header.Set(k, v)
	}
	return h.next.RoundTrip(r)
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

func preview(s string) string {
	if len(s) > 120 {
		return s[:120] + "…"
	}
	return s
}
