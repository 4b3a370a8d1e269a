package tools

import (
	"context"
	"fmt"
	"strings"

	"github.com/google/jsonschema-go/jsonschema"
)

// LoadSkill is the name of the tool that activates skills.
const LoadSkill = "load_skill"

// LoadSkillResult is the structured content of load_skill.
type LoadSkillResult struct {
	Skill string   `json:"skill"`
	Tools []string `json:"tools"` // the tools the skill made active
}

type loadSkillArgs struct {
	Skill string `json:"skill" jsonschema:"the skill to load, e.g. workspace.edit"`
}

var loadSkillTool = newTool(spec[loadSkillArgs, *LoadSkillResult]{
	name: LoadSkill,
	describe: func(*Set) string {
		var lines []string
		for _, sk := range skillDefs {
			need := ""
			if sk.grant != "" {
				need = ", needs the grant " + sk.grant
			}
			lines = append(lines, fmt.Sprintf("%s (%s%s)", sk.name, sk.desc(), need))
		}
		return "Activate a skill, making its tools available: " + strings.Join(lines, "; ") + "."
	},
	constrain: func(props map[string]*jsonschema.Schema) {
		for _, sk := range skillDefs {
			props["skill"].Enum = append(props["skill"].Enum, sk.name)
		}
	},
	handle:   (*Set).loadSkill,
	readOnly: yes,
})

func (s *Set) loadSkill(ctx context.Context, p loadSkillArgs, c *call) (Result, error) {
	sk := skillByName(p.Skill)
	if sk == nil {
		return Result{}, invalid("unknown skill %q: the skills are workspace.read, workspace.edit, workspace.shell", p.Skill)
	}
	if !s.granted(sk) {
		return failure(KindCapabilityForbidden, fmt.Sprintf("%s needs the grant %s, which this session does not have; its tools stay unavailable", sk.name, sk.grant)), nil
	}
	s.mu.Lock()
	changed := !s.active[sk.name]
	s.active[sk.name] = true
	s.mu.Unlock()
	if changed && s.env.SkillsChanged != nil {
		if err := s.env.SkillsChanged(ctx); err != nil {
			s.mu.Lock()
			s.active[sk.name] = false
			s.mu.Unlock()
			return Result{}, fmt.Errorf("%s was not loaded: %w", sk.name, err)
		}
	}
	tools := s.registered(sk)
	if changed && c.opts.ToolsChanged != nil {
		c.opts.ToolsChanged()
	}
	text := fmt.Sprintf("Loaded %s: %s now available.", sk.name, strings.Join(tools, ", "))
	if !changed {
		text = fmt.Sprintf("%s is already active: %s.", sk.name, strings.Join(tools, ", "))
	}
	return Result{Text: text, Structured: &LoadSkillResult{Skill: sk.name, Tools: tools}}, nil
}
