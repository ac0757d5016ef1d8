package pattern

import "testing"

func TestLazyCompilesOnce(t *testing.T) {
	re := Lazy(`^a+$`)
	first := re()
	if !first.MatchString("aaa") || first.MatchString("ab") {
		t.Fatal("the expression does not match as written")
	}
	if re() != first {
		t.Fatal("compiled again on the second call")
	}
}

func TestLazyPanicsOnFirstUseOfABadExpression(t *testing.T) {
	re := Lazy(`(`) // no panic here
	defer func() {
		if recover() == nil {
			t.Fatal("a bad expression did not panic on first use")
		}
	}()
	t.Errorf("compiled %v", re())
}
