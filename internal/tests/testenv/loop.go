package testenv

import (
	"context"
	"sync"
	"testing"
)

// Loop runs f in n goroutines, each calling it again and again with a
// context that ends when the test ends or stop is called; stop returns
// once every goroutine has (calling it again does nothing). It is a load
// of work for a test to watch: permits held and released, say.
func Loop(t testing.TB, n int, f func(ctx context.Context)) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for ctx.Err() == nil {
				f(ctx)
			}
		})
	}
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	t.Cleanup(stop)
	return stop
}
