module fencekeeper

go 1.19
