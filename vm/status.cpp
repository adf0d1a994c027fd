// Out-of-line anchor for status.h (keeps the vm library non-empty while it grows).
#include "vm/status.h"
