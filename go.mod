module github.com/kerneldeck/kerneldeck

go 1.26
