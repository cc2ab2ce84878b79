package skills_test

import (
	"errors"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/internal/skills"
)

const reportMD = `---
name: report
description: Build a delivery report.
version: "2"
handoffs: [review]
tools:
  - name: count_rows
    description: Count rows of a table.
    parameters:
      type: object
      properties:
        table: {type: string}
      required: [table]
  - name: render
    description: Render the report.
    resultKind: final
  - name: publish
    mode: mutate
    tier: 2
    permission: {effect: write_external, isDestructive: true}
---
# Report

Count rows first, then render.
`

func TestParseReadsFrontMatterAndInstructions(t *testing.T) {
	s, err := skills.Parse([]byte(reportMD))
	require.NoError(t, err)
	assert.Equal(t, "report", s.Name)
	assert.Equal(t, "2", s.Version)
	assert.Equal(t, []string{"review"}, s.Handoffs)
	require.Len(t, s.Tools, 3)
	assert.Equal(t, []any{"table"}, s.Tools[0].Parameters["required"])
	assert.Equal(t, "final", s.Tools[1].ResultKind)
	assert.Equal(t, "mutate", s.Tools[2].Mode)
	require.NotNil(t, s.Tools[2].Permission)
	assert.Equal(t, "write_external", s.Tools[2].Permission.Effect)
	assert.True(t, *s.Tools[2].Permission.Destructive)
	assert.Equal(t, "# Report\n\nCount rows first, then render.", s.Instructions)

	fsys := fstest.MapFS{"skills/report/SKILL.md": {Data: []byte(reportMD)}}
	loaded, err := skills.Load(fsys, "skills/report")
	require.NoError(t, err)
	assert.Equal(t, s, loaded)
	noVersion, err := skills.Parse([]byte("---\nname: a\ndescription: A.\n---\n"))
	require.NoError(t, err)
	assert.Equal(t, "1", noVersion.Version, "the default version")
}

func TestInvalidSkillsAreRefusedWithTheirReason(t *testing.T) {
	for name, tc := range map[string]struct{ doc, reason string }{
		"no front matter":         {"# Report\n", "front matter"},
		"front matter unclosed":   {"---\nname: a\n", "not closed"},
		"an unknown field":        {"---\nname: a\ndescription: A.\ncolour: red\n---\n", "colour"},
		"a bad name":              {"---\nname: Report!\ndescription: A.\n---\n", "lower-case"},
		"no description":          {"---\nname: a\n---\n", "description"},
		"a runtime action tool":   {"---\nname: a\ndescription: A.\ntools: [{name: read_agent_skill}]\n---\n", "runtime action"},
		"a tool twice":            {"---\nname: a\ndescription: A.\ntools: [{name: x}, {name: x}]\n---\n", "twice"},
		"an unknown resultKind":   {"---\nname: a\ndescription: A.\ntools: [{name: x, resultKind: maybe}]\n---\n", "resultKind"},
		"an unknown mode":         {"---\nname: a\ndescription: A.\ntools: [{name: x, mode: delete}]\n---\n", "mode"},
		"a tier out of range":     {"---\nname: a\ndescription: A.\ntools: [{name: x, tier: 7}]\n---\n", "tier"},
		"non-object parameters":   {"---\nname: a\ndescription: A.\ntools: [{name: x, parameters: {type: string}}]\n---\n", "object schema"},
		"a handoff to itself":     {"---\nname: a\ndescription: A.\nhandoffs: [a]\n---\n", "handoff"},
		"instructions as a field": {"---\nname: a\ndescription: A.\ninstructions: x\n---\n", "body"},
		"instructions too long":   {"---\nname: a\ndescription: A.\n---\n" + strings.Repeat("x", skills.MaxInstructionsBytes+1), "bytes"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := skills.Parse([]byte(tc.doc))
			require.Error(t, err)
			assert.True(t, errors.Is(err, actionbus.ErrInvalidSkill), "%v", err)
			assert.Contains(t, err.Error(), tc.reason)
		})
	}
}

func TestKeysNeverCollideWithActions(t *testing.T) {
	assert.Equal(t, "default.=skill.report", skills.Key("default", "report"))
	assert.Equal(t, "skill.report.count_rows", skills.ActionName("report", "count_rows"))
	for _, n := range []string{skills.ListSkills, skills.ReadSkill, skills.UseSkill, skills.Handoff} {
		assert.True(t, skills.Mutator(n), n)
		assert.True(t, skills.Runtime(n), n)
	}
	assert.False(t, skills.Mutator(skills.ExecuteTool))
	assert.True(t, skills.Runtime(skills.ExecuteTool))
}

// FuzzParse: any SKILL.md either parses into a valid skill or is refused
// with invalid_skill; nothing panics.
func FuzzParse(f *testing.F) {
	f.Add([]byte(reportMD))
	f.Add([]byte("---\nname: a\ndescription: A.\n---\nbody"))
	f.Add([]byte("---\n---\n"))
	f.Add([]byte("---\ntools: [{name: x, parameters: [1, 2]}]\n---"))
	f.Fuzz(func(t *testing.T, doc []byte) {
		s, err := skills.Parse(doc)
		if err != nil {
			if !errors.Is(err, actionbus.ErrInvalidSkill) {
				t.Fatalf("a refusal without its code: %v", err)
			}
			return
		}
		if verr := s.Validate(); verr != nil {
			t.Fatalf("parsed an invalid skill: %v", verr)
		}
	})
}
