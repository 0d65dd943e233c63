// Helpers for the trainer tests.
#pragma once

#include "tests/testing/temp_dir.h"
