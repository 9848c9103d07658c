/* lumenrt native core: umbrella header. */
#ifndef LRT_LRT_H
#define LRT_LRT_H
#include "common.h"
#include "ring.h"
#include "slab.h"
#include "bump.h"
#include "shm.h"
#include "notifier.h"
#include "latch.h"
#endif
