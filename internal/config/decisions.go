package config

import "time"

// Decisions configures the node's decision log (docs/decisions.md): what
// its sidecars report is kept under data_dir/decisions, not replicated.
type Decisions struct {
	// Enabled makes the node take its sidecars' decision records.
	Enabled bool `mapstructure:"enabled"`
	// Retention drops whole segments whose newest record is older.
	Retention time.Duration `mapstructure:"retention"`
	// MaxBytes caps the store; the oldest segments go first.
	MaxBytes int64 `mapstructure:"max_bytes"`
	// ExportFile, if set, gets every record kept as one JSON line, for a
	// log shipper; it is rotated to ExportFile.1 at ExportMaxBytes.
	ExportFile     string `mapstructure:"export_file"`
	ExportMaxBytes int64  `mapstructure:"export_max_bytes"`
	// MaskIdentities hides employees and client addresses from read
	// tokens (a hash stands in); admin tokens see them.
	MaskIdentities bool `mapstructure:"mask_identities"`
	// MaxRecordsPerSecond caps what one sidecar may report; a batch over it
	// is refused (the SDK keeps it and sends it again).
	MaxRecordsPerSecond int `mapstructure:"max_records_per_second"`
}

// validateDecisions refuses sizes that could only fail later.
func (c *Config) validateDecisions(p *problems) {
	d := c.Decisions
	if d.Retention < time.Minute {
		p.add("decisions.retention", "%v must be at least 1m", d.Retention)
	}
	if d.MaxBytes < 64<<20 {
		p.add("decisions.max_bytes", "%d must be at least 67108864 (64 MiB, one segment)", d.MaxBytes)
	}
	if d.ExportMaxBytes < 1<<20 {
		p.add("decisions.export_max_bytes", "%d must be at least 1048576 (1 MiB)", d.ExportMaxBytes)
	}
	if d.MaxRecordsPerSecond <= 0 {
		p.add("decisions.max_records_per_second", "%d must be above 0", d.MaxRecordsPerSecond)
	}
}
