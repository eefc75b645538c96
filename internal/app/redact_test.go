package app_test

import (
	"testing"

	"github.com/batchmr/batchmr/internal/app"
)

func TestRedactMasksEveryPasswordOfAURLOrConnectionString(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"redis://admin:S3cr3t@localhost:63x9/0":                           "redis://admin:xxxxx@localhost:63x9/0",
		"rediss://:S3cr3t@redis.internal:6380":                            "rediss://:xxxxx@redis.internal:6380",
		`parse "redis://u:p%40ss@h:1/0": invalid port`:                    `parse "redis://u:xxxxx@h:1/0": invalid port`,
		"postgres://app:S3cr3t@db:5432/shop?sslmode=verify-full":          "postgres://app:xxxxx@db:5432/shop?sslmode=verify-full",
		"postgres://db/shop?user=app&password=S3cr3t&sslmode=require":     "postgres://db/shop?user=app&password=xxxxx&sslmode=require",
		"host=db user=app password='S3 cr\\'et' dbname=shop":              "host=db user=app password=xxxxx dbname=shop",
		"host=db password=S3cr3t dbname=shop":                             "host=db password=xxxxx dbname=shop",
		"redis://sentinel:26379/0?master_name=m&sentinel_password=S3cr3t": "redis://sentinel:26379/0?master_name=m&sentinel_password=xxxxx",
		"redis://localhost:6379/0":                                        "redis://localhost:6379/0",
		"redis://user@localhost:6379/0":                                   "redis://user@localhost:6379/0",
		"unix://:S3cr3t@/run/redis.sock?db=1":                             "unix://:xxxxx@/run/redis.sock?db=1",
		"the user, password and database of --database-url":               "the user, password and database of --database-url",
	} {
		if got := app.Redact(in); got != want {
			t.Errorf("Redact(%q) = %q; want %q", in, got, want)
		}
	}
}
