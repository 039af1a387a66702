"""Data sets: stoker's native ones, read in C++ (native), and torchvision's ImageFolder
recognised and run natively or in part natively (torchvision)."""
