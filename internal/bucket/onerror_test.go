package bucket

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestParseOnError(t *testing.T) {
	for in, want := range map[string]OnError{"": Allow, "allow": Allow, "deny": Deny, "local": Local} {
		got, err := ParseOnError(in)
		if err != nil || got != want {
			t.Errorf("ParseOnError(%q) = %v, %v; want %v", in, got, err, want)
		}
		if in != "" && got.String() != in {
			t.Errorf("%v.String() = %q, want %q", got, got.String(), in)
		}
	}
	if _, err := ParseOnError("retry"); err == nil || !strings.Contains(err.Error(), `store.on_error "retry"`) {
		t.Errorf("ParseOnError(retry): got %v, want an error naming the field and value", err)
	}
	if Allow.FailsClosed() || !Deny.FailsClosed() || Local.FailsClosed() {
		t.Error("only Deny fails closed")
	}
}

func TestRuleOf(t *testing.T) {
	ue := &UndecidedError{Rule: Deny, Err: context.DeadlineExceeded}
	wrapped := fmt.Errorf("front: %w", ue)
	if RuleOf(wrapped) != Deny || !errors.Is(wrapped, context.DeadlineExceeded) {
		t.Errorf("RuleOf(%v) = %v, want deny, with the cause inside", wrapped, RuleOf(wrapped))
	}
	if RuleOf(errors.New("unguarded")) != Allow {
		t.Error("an error that carries no rule: want the default, allow")
	}
}
