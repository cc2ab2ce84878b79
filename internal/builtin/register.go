package builtin

import (
	"context"
	"errors"
	"time"

	"github.com/actionbus/actionbus/executor"
)

// Config says which built-in actions an executor hosts.
type Config struct {
	// Net guards read_url and web_search; its zero value allows public
	// addresses only.
	Net NetGuard
	// SearchEndpoint is a SearxNG-style JSON search endpoint; web_search
	// is registered when it is set.
	SearchEndpoint string
	// WorkspaceRoot is the directory of the workspace file actions; they
	// are registered when it is set.
	WorkspaceRoot string
	// SQLitePath is the database of sqlite_query; registered when set.
	SQLitePath string
	// Shell, when set, registers shell (seed 003's safe profile) over
	// Shell.Root, or WorkspaceRoot when that is empty.
	Shell *ShellConfig
}

// Mounted holds what Register opened; Close releases it.
type Mounted struct {
	closers []func() error
}

// Close closes the workspace root and the database.
func (m *Mounted) Close() error {
	var errs []error
	for _, c := range m.closers {
		errs = append(errs, c())
	}
	return errors.Join(errs...)
}

func ptr[T any](v T) *T { return &v }

func readOnly(effect string) *executor.Permission {
	return &executor.Permission{Effect: effect, InterruptBehavior: "abort_safe", ConcurrencySafe: ptr(true), Destructive: ptr(false),
		ReadOnly: ptr(true), NeedsApproval: ptr(false), Source: "built_in_metadata"}
}

func writes(effect string) *executor.Permission {
	return &executor.Permission{Effect: effect, InterruptBehavior: "block", ConcurrencySafe: ptr(false), Destructive: ptr(true),
		ReadOnly: ptr(false), NeedsApproval: ptr(true), Source: "built_in_metadata"}
}

// Register registers read_url, and the other built-ins cfg enables, on ex.
func Register(ex *executor.Executor, cfg Config) (*Mounted, error) {
	m := &Mounted{}
	reader := NewURLReader(cfg.Net)
	err := executor.Register(ex, executor.Action{
		Name: "read_url", Description: "Read one public web page (GET or HEAD) as readable text, JSON or raw text.",
		Mode: executor.ModeRead, Tier: 0, Version: "1", Timeout: 2 * time.Minute,
		Permission: readOnly("external_network"), Tags: []string{"web", "research"}, ResourceType: "url", RiskLevel: "low",
		Planner: &executor.PlannerMeta{Aliases: []string{"browse", "fetch_url", "open_url", "fetch", "read_page"},
			ArgsExample: map[string]any{"url": "https://example.com/article", "mode": "html_text"},
			Guidance:    "Use when the user gives a URL or when search snippets are not enough."},
		// Pages can be large: the audit keeps what was read, not the text.
		AuditPolicy: &executor.AuditPolicy{Output: "summary"},
	}, func(ctx context.Context, in ReadURLArgs, _ executor.Call) (executor.Result[ReadURLResult], error) {
		res := reader.Read(ctx, in)
		summary := res.Reason
		if res.OK {
			summary = res.Title
			if summary == "" {
				summary = res.FinalURL
			}
		}
		return executor.Result[ReadURLResult]{Output: res, Summary: summary}, nil
	})
	if err != nil {
		return nil, err
	}
	if cfg.SearchEndpoint != "" {
		s, err := NewSearcher(cfg.SearchEndpoint, cfg.Net)
		if err != nil {
			return nil, err
		}
		err = executor.Register(ex, executor.Action{
			Name: "web_search", Description: "Search the web; returns titles, URLs and snippets.",
			Mode: executor.ModeRead, Tier: 0, Version: "1", Timeout: 30 * time.Second,
			Permission: readOnly("external_network"), Tags: []string{"web", "research"}, RiskLevel: "low",
			Planner: &executor.PlannerMeta{Aliases: []string{"search", "websearch", "search_web"}, ArgsExample: map[string]any{"query": "nats jetstream consumers", "limit": 5},
				Guidance: "Use to find sources; then read_url the best results."},
		}, func(ctx context.Context, in WebSearchArgs, _ executor.Call) (executor.Result[WebSearchResult], error) {
			res, err := s.Search(ctx, in)
			return executor.Result[WebSearchResult]{Output: res}, err
		})
		if err != nil {
			return nil, err
		}
	}
	if cfg.WorkspaceRoot != "" {
		ws, err := OpenWorkspace(cfg.WorkspaceRoot)
		if err != nil {
			return nil, err
		}
		m.closers = append(m.closers, ws.Close)
		if err := registerWorkspace(ex, ws); err != nil {
			return nil, errors.Join(err, m.Close())
		}
	}
	if cfg.Shell != nil {
		sc := *cfg.Shell
		if sc.Root == "" {
			sc.Root = cfg.WorkspaceRoot
		}
		if sc.Root == "" {
			return nil, errors.Join(errors.New("builtin: the shell needs a root (Shell.Root or WorkspaceRoot)"), m.Close())
		}
		if err := registerShell(ex, sc); err != nil {
			return nil, errors.Join(err, m.Close())
		}
	}
	if cfg.SQLitePath != "" {
		q, err := OpenSQLiteQuery(cfg.SQLitePath, 0, 0)
		if err != nil {
			return nil, errors.Join(err, m.Close())
		}
		m.closers = append(m.closers, q.Close)
		err = executor.Register(ex, executor.Action{
			Name: "sqlite_query", Description: "Run one read-only SELECT on the configured SQLite database.",
			Mode: executor.ModeRead, Tier: 0, Version: "1", Timeout: 30 * time.Second,
			Permission: readOnly("read_state"), Tags: []string{"data"}, ResourceType: "database", RiskLevel: "low",
			Planner:     &executor.PlannerMeta{ArgsExample: map[string]any{"sql": "SELECT id, status FROM jobs WHERE status = ? LIMIT 20", "params": []any{"FAILED"}}},
			AuditPolicy: &executor.AuditPolicy{Output: "summary"},
		}, func(ctx context.Context, in SQLiteArgs, _ executor.Call) (executor.Result[SQLiteResult], error) {
			res, err := q.Query(ctx, in)
			return executor.Result[SQLiteResult]{Output: res}, err
		})
		if err != nil {
			return nil, errors.Join(err, m.Close())
		}
	}
	return m, nil
}

func registerWorkspace(ex *executor.Executor, ws *Workspace) error {
	ro := func(name, desc string, example map[string]any) executor.Action {
		return executor.Action{Name: name, Description: desc, Mode: executor.ModeRead, Tier: 0, Version: "1", Timeout: 30 * time.Second,
			Permission: readOnly("filesystem"), Tags: []string{"workspace"}, ResourceType: "file", RiskLevel: "low",
			Planner: &executor.PlannerMeta{ArgsExample: example}}
	}
	rw := func(name, desc string, example map[string]any) executor.Action {
		return executor.Action{Name: name, Description: desc, Mode: executor.ModeMutate, Tier: 2, Version: "1", Timeout: 30 * time.Second,
			Permission: writes("filesystem"), Tags: []string{"workspace"}, ResourceType: "file", RiskLevel: "medium",
			Planner: &executor.PlannerMeta{ArgsExample: example},
			// File contents are the user's code: audit keeps hashes.
			AuditPolicy: &executor.AuditPolicy{Input: "hash", Output: "full"}}
	}
	return errors.Join(
		executor.Register(ex, ro("read_file", "Read a text file of the workspace, with its SHA-256.", map[string]any{"path": "src/main.go"}),
			func(_ context.Context, in ReadFileArgs, c executor.Call) (executor.Result[FileContent], error) {
				res, err := ws.ReadFile(c.RunID, in)
				return executor.Result[FileContent]{Output: res, Summary: res.Path}, err
			}),
		executor.Register(ex, ro("glob_files", "List workspace files matching a glob (** for any depth).", map[string]any{"pattern": "**/*.go"}),
			func(_ context.Context, in GlobArgs, _ executor.Call) (executor.Result[GlobResult], error) {
				res, err := ws.GlobFiles(in)
				return executor.Result[GlobResult]{Output: res}, err
			}),
		executor.Register(ex, ro("grep_files", "Search workspace text files for a regular expression.", map[string]any{"pattern": "TODO", "glob": "**/*.go"}),
			func(_ context.Context, in GrepArgs, _ executor.Call) (executor.Result[GrepResult], error) {
				res, err := ws.GrepFiles(in)
				return executor.Result[GrepResult]{Output: res}, err
			}),
		executor.Register(ex, rw("edit_file", "Replace an exact string in a workspace file; refused if the file changed since it was read.",
			map[string]any{"path": "src/main.go", "old_string": "hi", "new_string": "hello", "expected_sha256": "<sha256 from read_file>"}),
			func(_ context.Context, in EditArgs, c executor.Call) (executor.Result[WriteResult], error) {
				res, err := ws.EditFile(c.RunID, in)
				return executor.Result[WriteResult]{Output: res}, err
			}),
		executor.Register(ex, rw("apply_patch", "Apply a unified diff to the workspace; every hunk applies exactly or nothing is written.",
			map[string]any{"patch": "--- a/f\n+++ b/f\n@@ -1 +1 @@\n-old\n+new\n"}),
			func(_ context.Context, in PatchArgs, c executor.Call) (executor.Result[PatchResult], error) {
				res, err := ws.ApplyPatch(c.RunID, in)
				return executor.Result[PatchResult]{Output: res}, err
			}),
		executor.Register(ex, rw("write_file", "Write a whole workspace file; an existing file must have been read in the run or its hash given.",
			map[string]any{"path": "docs/notes.md", "content": "..."}),
			func(_ context.Context, in WriteArgs, c executor.Call) (executor.Result[WriteResult], error) {
				res, err := ws.WriteFile(c.RunID, in)
				return executor.Result[WriteResult]{Output: res}, err
			}),
	)
}
