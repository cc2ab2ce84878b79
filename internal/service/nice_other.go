//go:build !linux

package service

import "errors"

func setNice(int) error { return errors.New("niceness is only set on Linux") }
