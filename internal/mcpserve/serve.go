// Package mcpserve serves the action catalog as an MCP server (actionbus
// mcp serve): any MCP client lists the planner-visible actions as tools and
// calls them. Each call is a one-action host run through the dispatcher —
// admission, policy, approvals and audit as any run — recorded as the
// served user's. A call that needs an approval tells the client at once (a
// progress notification with the approval id and the command that gives
// it, when the client sent a progress token) and completes if the
// approval comes before the call's deadline;
// otherwise it returns, saying the run waits for that approval.
package mcpserve

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/internal/httpapi"
	"github.com/actionbus/actionbus/internal/tracing"
)

// MetaRunID is the _meta key of a call result that names its run (for
// actionbus watch, audit export --run).
const MetaRunID = "actionbus/runId"

// Config configures a Server.
type Config struct {
	// Client reaches the bus; its NATS user is the one the calls run as.
	Client *client.Client
	// UserID is recorded as the user of every run; default "mcp".
	UserID string
	// AllowedModes are the modes calls may use; default read, draft,
	// dryRun and mutate (mutations still wait for an approval).
	AllowedModes []string
	// CallTimeout bounds one call, an approval wait included; default 60 s.
	CallTimeout time.Duration
	// Refresh is how often the tool list follows the catalog; default 5 s.
	Refresh time.Duration
	// Logger receives the server's logs; nil discards them.
	Logger *slog.Logger
	// Gateway, when set, is how [Server.HTTPHandler] authenticates
	// callers; stdio serves the one local user UserID.
	Gateway *Gateway
}

// Gateway authenticates the callers of the streamable HTTP transport with
// the HTTP API's bearer tokens: the read role lists tools, run calls them,
// and each call's run acts for the token's user with its grants, signed
// with the gateway's approval key (a "kid:secret:*" key of the
// dispatcher's).
type Gateway struct {
	Tokens httpapi.Tokens
	// KeyID and Key sign each call's principal; without a key, calls'
	// runs hold what the policy grants the tenant's NATS clients.
	KeyID string
	Key   []byte
}

func (c *Config) setDefaults() {
	if c.UserID == "" {
		c.UserID = "mcp"
	}
	if c.AllowedModes == nil {
		c.AllowedModes = []string{"read", "draft", "dryRun", "mutate"}
	}
	if c.CallTimeout <= 0 {
		c.CallTimeout = 60 * time.Second
	}
	if c.Refresh <= 0 {
		c.Refresh = 5 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Server is the MCP server over the catalog.
type Server struct {
	cfg    Config
	server *mcp.Server

	mu    sync.Mutex
	tools map[string]string // tool name → definition hash
}

// New returns a server; Sync (or Run) fills its tools from the catalog.
func New(cfg Config) *Server {
	cfg.setDefaults()
	s := &Server{cfg: cfg, tools: map[string]string{},
		server: mcp.NewServer(&mcp.Implementation{Name: "actionbus", Version: "1"}, nil)}
	return s
}

// MCP returns the SDK server (for transports: stdio, streamable HTTP).
func (s *Server) MCP() *mcp.Server { return s.server }

// Sync makes the tool list the catalog's planner-visible actions: new and
// changed actions are added, removed ones taken away (clients are told
// the list changed).
func (s *Server) Sync(ctx context.Context) error {
	list, err := s.cfg.Client.Actions(ctx)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	seen := map[string]bool{}
	for _, a := range list {
		if !a.PlannerVisible {
			continue
		}
		seen[a.Name] = true
		if s.tools[a.Name] == a.Hash {
			continue
		}
		s.server.AddTool(tool(a), s.call(a.Name))
		s.tools[a.Name] = a.Hash
	}
	var gone []string
	for name := range s.tools {
		if !seen[name] {
			gone = append(gone, name)
			delete(s.tools, name)
		}
	}
	if len(gone) > 0 {
		s.server.RemoveTools(gone...)
	}
	return nil
}

// Run follows the catalog until ctx ends.
func (s *Server) Run(ctx context.Context) {
	t := time.NewTicker(s.cfg.Refresh)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := s.Sync(ctx); err != nil && ctx.Err() == nil {
				s.cfg.Logger.Warn("catalog refresh failed", "err", err)
			}
		}
	}
}

// tool is an action as an MCP tool: its input schema, and annotations
// derived from its mode.
func tool(a client.ActionInfo) *mcp.Tool {
	var schema any = map[string]any{"type": "object"}
	if len(a.InputSchema) > 0 {
		var m map[string]any
		if json.Unmarshal(a.InputSchema, &m) == nil && m["type"] == "object" {
			schema = m
		}
	}
	readOnly := a.Mode == "read"
	destructive := a.Mode == "mutate" || a.Permission.Destructive
	desc := a.Description
	if a.Mode == "mutate" {
		desc += " (changes state: runs after an approval)"
	}
	return &mcp.Tool{Name: a.Name, Description: desc, InputSchema: schema,
		Annotations: &mcp.ToolAnnotations{Title: a.Name, ReadOnlyHint: readOnly, DestructiveHint: &destructive, IdempotentHint: readOnly}}
}

// call runs one tool call as a one-action host run.
func (s *Server) call(name string) mcp.ToolHandler {
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		args := map[string]any{}
		if len(req.Params.Arguments) > 0 {
			if err := json.Unmarshal(req.Params.Arguments, &args); err != nil {
				return failure(actionbus.Errorf(actionbus.CodeActionArgsInvalid, "arguments must be a JSON object")), nil
			}
		}
		// A caller's trace context in params._meta: the run joins its trace.
		ctx = tracing.FromMeta(ctx, req.Params.GetMeta())
		run := client.RunRequest{Action: &client.ActionCall{Name: name, Args: args}, UserID: s.cfg.UserID, AllowedModes: s.cfg.AllowedModes}
		if s.cfg.Gateway != nil {
			tok, err := s.caller(req)
			if err != nil {
				return failure(err), nil
			}
			run.UserID, run.Principal = tok.User, tok.Principal(s.cfg.Gateway.KeyID, s.cfg.Gateway.Key)
		}
		ctx, cancel := context.WithTimeout(ctx, s.cfg.CallTimeout)
		defer cancel()
		token := req.Params.GetProgressToken()
		var approvalID, runID string
		var mu sync.Mutex
		res, err := s.cfg.Client.Run(ctx, run, func(e client.Event) {
			mu.Lock()
			runID = e.RunID
			mu.Unlock()
			st, ok := e.Step()
			if !ok || st.Name != "awaiting-approval" {
				return
			}
			id, _ := st.Details["approvalId"].(string)
			mu.Lock()
			approvalID = id
			mu.Unlock()
			msg := awaiting(id, e.RunID)
			if token != nil {
				_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: token, Message: msg})
			}
		})
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			if ctx.Err() != nil && approvalID != "" {
				// Told the client already; the run goes on and completes
				// once approved.
				return &mcp.CallToolResult{Meta: mcp.Meta{MetaRunID: runID}, IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: awaiting(approvalID, runID) +
					"; the call's deadline passed first: the run continues and ends when the approval is answered (actionbus watch " + runID + ")."}},
					StructuredContent: map[string]any{"status": "awaiting_approval", "approvalId": approvalID, "runId": runID}}, nil
			}
			return failure(actionbus.Errorf(actionbus.CodeTimeout, "%s: %v", name, err)), nil
		}
		meta := mcp.Meta{MetaRunID: res.RunID}
		switch res.Status {
		case client.StatusCompleted:
			out := &mcp.CallToolResult{Meta: meta, Content: []mcp.Content{&mcp.TextContent{Text: text(res)}}}
			if m, ok := res.Output.(map[string]any); ok {
				out.StructuredContent = m
			}
			return out, nil
		case client.StatusFailed:
			out := failure(res.Error)
			out.Meta = meta
			return out, nil
		}
		out := failure(actionbus.Errorf(actionbus.CodeCanceled, "the run was %s: %s", res.Status, res.Reason))
		out.Meta = meta
		return out, nil
	}
}

// HTTPHandler serves MCP's streamable HTTP transport to callers the
// gateway authenticates: a request without a known bearer token is
// answered 401 before MCP sees it. It needs Config.Gateway.
func (s *Server) HTTPHandler() (http.Handler, error) {
	gw := s.cfg.Gateway
	if gw == nil {
		return nil, errors.New("mcpserve: serving HTTP needs a gateway (bearer tokens)")
	}
	verify := func(_ context.Context, bearer string, _ *http.Request) (*auth.TokenInfo, error) {
		tok, err := gw.Tokens.Lookup(bearer)
		if err != nil || !tok.May(httpapi.RoleRead) {
			return nil, auth.ErrInvalidToken
		}
		return &auth.TokenInfo{UserID: tok.User, Scopes: tok.Roles, Extra: map[string]any{tokenKey: tok}}, nil
	}
	mcpHandler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s.server }, nil)
	return auth.RequireBearerToken(verify, &auth.RequireBearerTokenOptions{AllowMissingExpiration: true})(mcpHandler), nil
}

// tokenKey holds a caller's token entry in its TokenInfo.
const tokenKey = "actionbus/token"

// caller is the authenticated token of an HTTP call, which must hold the
// run role.
func (s *Server) caller(req *mcp.CallToolRequest) (*httpapi.Token, *actionbus.Error) {
	var tok *httpapi.Token
	if req.Extra != nil && req.Extra.TokenInfo != nil {
		tok, _ = req.Extra.TokenInfo.Extra[tokenKey].(*httpapi.Token)
	}
	if tok == nil {
		return nil, actionbus.Errorf(actionbus.CodeUnauthenticated, "a call needs a bearer token")
	}
	if !tok.May(httpapi.RoleRun) {
		return nil, actionbus.Errorf(actionbus.CodeForbidden, "user %s lacks the %s role", tok.User, httpapi.RoleRun)
	}
	return tok, nil
}

func awaiting(approvalID, runID string) string {
	return fmt.Sprintf("awaiting approval %s (run %s): an approver gives it with `actionbus approve %s` (or denies it with `actionbus deny %s`)",
		approvalID, runID, approvalID, approvalID)
}

func failure(e *actionbus.Error) *mcp.CallToolResult {
	if e == nil {
		e = actionbus.Errorf(actionbus.CodeInternal, "the run failed without an error")
	}
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: string(e.Code) + ": " + e.Message}},
		StructuredContent: map[string]any{"code": string(e.Code), "message": e.Message}}
}

func text(res *client.Result) string {
	b, err := json.Marshal(res.Output)
	if err != nil || res.Output == nil {
		return res.Answer
	}
	if res.Answer != "" && !slices.Contains([]string{"null", "{}"}, string(b)) {
		return strings.TrimSpace(res.Answer) + "\n" + string(b)
	}
	return string(b)
}
