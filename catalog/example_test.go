package catalog_test

import (
	"fmt"

	"github.com/actionbus/actionbus/catalog"
)

// A mutate action that declares only its effect: every other field falls
// back conservatively from its mode, and no declaration makes a mutate
// action need no approval.
func ExamplePermission_Normalize() {
	no := false
	p := &catalog.Permission{Effect: "external_network", NeedsApproval: &no}
	n := p.Normalize(catalog.ModeMutate)
	fmt.Printf("effect=%s destructive=%t needsApproval=%t interrupt=%s source=%s\n",
		n.Effect, n.Destructive, n.NeedsApproval, n.InterruptBehavior, n.Source)
	// Output: effect=external_network destructive=true needsApproval=true interrupt=block source=fallback
}

// Calls whose keys render equal share one limit: here, at most two calls
// per tenant and customer at once.
func ExampleLimits_RenderKey() {
	l := catalog.Limits{Key: "{{.tenant}}/{{.input.customerId}}", MaxInFlight: 2}
	key, err := l.RenderKey(catalog.LimitCall{Tenant: "acme", Action: "crm.update",
		Input: map[string]any{"customerId": "c-9"}})
	fmt.Println(key, err)
	// Output: crm.update|acme/c-9 <nil>
}

// A skill is checked before it is announced: a tool may not take the name
// of one of the runtime actions of skills.
func ExampleSkill_Validate() {
	s := catalog.Skill{Name: "refunds", Description: "Refund an order.",
		Tools: []catalog.SkillTool{{Name: catalog.ActionUseSkill}}}
	fmt.Println(s.Validate())
	// Output: invalid_skill: skill "refunds": tool "use_agent_skill": a runtime action's name
}
