package descriptors

import (
	"fmt"
	"os"
)

// LoadFiles is Load for an explicit list of files, whatever their names
// (check-config uses it to validate a single file). Errors name each path
// as given.
func LoadFiles(paths []string, opts Options) (*Config, error) {
	files := make([]srcFile, 0, len(paths))
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("descriptors: %w", err)
		}
		files = append(files, srcFile{name: p, data: data})
	}
	return compile(files, opts)
}
